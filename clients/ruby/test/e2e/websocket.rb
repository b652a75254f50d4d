# frozen_string_literal: true

require "socket"
require "securerandom"
require "digest/sha1"
require "base64"
require "json"

# A minimal WebSocket client (RFC 6455) over a Unix socket, enough for
# Action Cable's actioncable-v1-json protocol: the handshake, masked text
# frames out, text/ping/close frames in. A reader thread queues every JSON
# message.
class WSClient
  attr_reader :messages

  def initialize(path, resource = "/cable")
    @sock = UNIXSocket.new(path)
    key = Base64.strict_encode64(SecureRandom.bytes(16))
    @sock.write("GET #{resource} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" \
                "Sec-WebSocket-Key: #{key}\r\nSec-WebSocket-Version: 13\r\n" \
                "Sec-WebSocket-Protocol: actioncable-v1-json\r\nOrigin: http://localhost\r\n\r\n")
    status = @sock.gets
    raise "WebSocket handshake: #{status.inspect}" unless status&.start_with?("HTTP/1.1 101")

    accept = nil
    while (line = @sock.gets) && line != "\r\n"
      accept = line.split(":", 2)[1].strip if line.downcase.start_with?("sec-websocket-accept:")
    end
    want = Base64.strict_encode64(Digest::SHA1.digest(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
    raise "WebSocket handshake: Sec-WebSocket-Accept #{accept.inspect}, want #{want}" unless accept == want

    @wmu = Mutex.new
    @messages = Queue.new
    @reader = Thread.new { read_loop }
    @reader.report_on_exception = false
  end

  def send_json(obj)
    write_frame(0x1, JSON.generate(obj))
  end

  # The next message for which the block is true (others are dropped), or
  # an error after timeout seconds.
  def next_message(timeout)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
      raise "no message within #{timeout}s" if left <= 0

      m = pop(left)
      raise "connection closed" if m == :closed
      next if m.nil?
      return m if !block_given? || yield(m)
    end
  end

  def close
    @sock.close
  rescue IOError
    nil
  end

  private

  def pop(timeout)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    loop do
      return @messages.pop(true)
    rescue ThreadError
      return nil if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.005
    end
  end

  def write_frame(opcode, data)
    data = data.b
    mask = SecureRandom.bytes(4)
    len = data.bytesize
    hdr = [0x80 | opcode].pack("C")
    hdr << if len < 126 then [0x80 | len].pack("C")
           elsif len < 65_536 then [0x80 | 126, len].pack("Cn")
           else [0x80 | 127, len].pack("CQ>")
           end
    masked = data.bytes.each_with_index.map { |b, i| b ^ mask.getbyte(i % 4) }.pack("C*")
    @wmu.synchronize { @sock.write(hdr + mask + masked) }
  end

  def read_exact(n)
    buf = +"".b
    buf << @sock.readpartial(n - buf.bytesize) while buf.bytesize < n
    buf
  end

  def read_loop
    loop do
      b0, b1 = read_exact(2).unpack("CC")
      len = b1 & 0x7f
      len = read_exact(2).unpack1("n") if len == 126
      len = read_exact(8).unpack1("Q>") if len == 127
      mask = (b1 & 0x80).zero? ? nil : read_exact(4)
      data = len.zero? ? +"".b : read_exact(len)
      data = data.bytes.each_with_index.map { |b, i| b ^ mask.getbyte(i % 4) }.pack("C*") if mask
      case b0 & 0x0f
      when 0x1 then @messages << JSON.parse(data.force_encoding(Encoding::UTF_8))
      when 0x9 then write_frame(0xA, data)
      when 0x8 then break
      end
    end
  rescue IOError, SystemCallError, EOFError
    nil
  ensure
    @messages << :closed
  end
end
