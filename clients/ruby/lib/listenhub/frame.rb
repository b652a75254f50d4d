# frozen_string_literal: true

require "json"
require "base64"

module Listenhub
  # The wire codec (docs/protocol.md): a 4-byte big-endian length, then one
  # compact JSON object. No I/O here.
  module Frame
    # Largest frame body either side may send (4 MiB). A longer length
    # header is a protocol error: the reader closes the connection without
    # allocating.
    MAX_LEN = 4 << 20

    # Postgres truncates identifiers at NAMEDATALEN-1 bytes.
    MAX_NAME_BYTES = 63

    # A malformed frame from the hub: the connection is unusable.
    class FrameError < StandardError; end

    module_function

    def encode(msg)
      body = JSON.generate(msg).b
      [body.bytesize].pack("N") + body
    end

    def sub(q)
      encode({ "t" => "sub", "q" => q })
    end

    def unsub(q)
      encode({ "t" => "unsub", "q" => q })
    end

    # Why q can never be a subscription name whatever the hub's prefix and
    # suffix (nil if it may be): checked before any round trip.
    def name_problem(q)
      return "not a string" unless q.is_a?(String)
      s = q.dup.force_encoding(Encoding::UTF_8)
      return "not valid UTF-8" unless s.valid_encoding?
      return "#{s.bytesize} bytes, the limit is #{MAX_NAME_BYTES}" if s.bytesize > MAX_NAME_BYTES
      return "contains NUL" if s.include?("\0")

      nil
    end

    # q as the hub names it: the same bytes as UTF-8, whatever q's own
    # encoding (a binary String from a socket or a file, say), so that the
    # hub's ack and wakes, UTF-8, match it. Call after name_problem.
    def wire_name(q)
      return q if !q.is_a?(String) || q.encoding == Encoding::UTF_8

      q.dup.force_encoding(Encoding::UTF_8).freeze
    end

    # Why the mapped channel is refused (nil if fine): empty, too long, NUL.
    def channel_problem(channel)
      return "invalid channel: empty" if channel.empty?
      return "invalid channel: #{channel.bytesize} bytes, the limit is #{MAX_NAME_BYTES}" if channel.bytesize > MAX_NAME_BYTES
      return "invalid channel: contains NUL" if channel.include?("\0")

      nil
    end

    # Tells a nack about the name (final for that name, the connection is
    # fine) from any other nack (this hub cannot serve: fail over). Protocol
    # v1 has no codes, so the reason words are the contract; the same rule as
    # the Go, Python and Node clients.
    def invalid_name_reason?(reason)
      r = reason.to_s.downcase
      r.start_with?("invalid") || r.include?("invalid channel") || r.include?("too long") || r.include?("contains nul")
    end

    # A refusal at one of the hub's caps: final for that subscribe, the
    # connection stays.
    def limit_reason?(reason)
      reason.to_s.downcase.start_with?("too many ")
    end

    # A channel as a Postgres quoted identifier, every '"' doubled: no name
    # can inject SQL, and case is kept.
    def quote_ident(channel)
      "\"#{channel.gsub('"', '""')}\""
    end

    # The bytes of a nack's "q64" (base64); "" if it is not base64.
    def q64_bytes(q64)
      Base64.strict_decode64(q64)
    rescue ArgumentError
      "".b
    end

    # Incremental decoder: feed what a read returned, then call next_message
    # until it returns nil. Linear in the bytes fed. partial_since is the
    # monotonic time at which the incomplete frame now buffered began (nil
    # when nothing is buffered), for the reader's frame timeout.
    class Decoder
      attr_reader :partial_since

      def initialize
        @buf = String.new(encoding: Encoding::BINARY)
        @off = 0
        @partial_since = nil
      end

      def feed(data)
        if @off.positive? && @off == @buf.bytesize
          @buf.clear
          @off = 0
        end
        @partial_since ||= Process.clock_gettime(Process::CLOCK_MONOTONIC) unless data.empty?
        @buf << data.b
      end

      def buffered
        @buf.bytesize - @off
      end

      # The next whole message (a Hash with a String "t"), or nil when more
      # bytes are needed. Raises FrameError on a malformed frame.
      def next_message
        return nil if buffered < 4

        n = @buf.byteslice(@off, 4).unpack1("N")
        raise FrameError, "bad frame length #{n}" if n.zero? || n > MAX_LEN
        return nil if buffered < 4 + n

        body = @buf.byteslice(@off + 4, n)
        @off += 4 + n
        @partial_since = @off < @buf.bytesize ? Process.clock_gettime(Process::CLOCK_MONOTONIC) : nil
        if @off > 65_536 && @off * 2 > @buf.bytesize
          @buf = @buf.byteslice(@off, @buf.bytesize - @off)
          @off = 0
        end
        body.force_encoding(Encoding::UTF_8)
        raise FrameError, "bad frame body: not valid UTF-8" unless body.valid_encoding?

        begin
          msg = JSON.parse(body)
        rescue JSON::ParserError => e
          raise FrameError, "bad frame body: #{e.message[0, 200]}"
        end
        raise FrameError, "frame is not an object with a string \"t\"" unless msg.is_a?(Hash) && msg["t"].is_a?(String)

        msg
      end
    end
  end

  # One NOTIFY as the hub (or the local listener) delivered it. payload is
  # nil for a durable wake ("something changed, re-read"), which may be
  # coalesced and may be synthesized after a gap (hub reconnect, failover);
  # a payload may be the only copy of the message.
  Wake = Struct.new(:name, :payload) do
    def durable?
      payload.nil?
    end

    def self.from(q, p)
      new(q, p.nil? || p.empty? ? nil : p)
    end
  end
end
