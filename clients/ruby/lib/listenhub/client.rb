# frozen_string_literal: true

require "socket"
require_relative "errors"
require_relative "listener"
require_relative "frame"

module Listenhub
  # Bound of the wait for an ack. The hub acks once Postgres confirmed the
  # LISTEN (a round trip); nothing within 2 s means a wedged hub.
  DEFAULT_ACK_TIMEOUT = 2.0
  # Bound of one write to the hub. Frames to the hub are tiny, so a write
  # that cannot finish means the hub stopped reading.
  DEFAULT_WRITE_TIMEOUT = 2.0
  # Bound of the connect.
  DEFAULT_CONNECT_TIMEOUT = 2.0
  # Bound of one frame from the hub, from its first byte to its last: the
  # hub's own --frame-timeout default. A hub that stops in the middle of a
  # frame is wedged; without it the client would wait forever.
  DEFAULT_FRAME_TIMEOUT = 10.0
  # No frame at all for this long means a frozen hub (SIGSTOPped, a wedged
  # loop): it re-sends its status every 5 status intervals (5 s by
  # default), so this is three of those missed. Raise it above 5 times the
  # hub's --status-interval when that is over 3 s.
  DEFAULT_SILENCE_TIMEOUT = 15.0
  # Where the hub listens unless told otherwise (LISTENHUB_SOCKET).
  DEFAULT_SOCKET = "/run/listenhub/listenhub.sock"

  # O_PATH (Linux; not in File::Constants): opens the socket's directory to
  # pin it without needing read permission on it.
  O_PATH = 0o10000000
  S_ISVTX = 0o1000

  def self.monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def self.logger
    @logger ||= begin
      require "logger"
      Logger.new($stderr, level: Logger::WARN, progname: "listenhub")
    end
  end

  # The gem logs through this logger. By default it writes warnings and
  # errors to stderr, so that a fallback to a connection of the process's
  # own is never silent (the Action Cable adapter hands it Action Cable's
  # logger unless one was set); set Logger.new(nil) to silence it.
  def self.logger=(logger)
    @logger_set = true
    @logger = logger
  end

  def self.logger_set?
    @logger_set == true
  end

  # Why a socket directory cannot be trusted (nil if it can), OpenSSH's
  # StrictModes rule: owned by us, root or an allowed uid, and not writable
  # by group or other unless sticky (like /tmp: there only an entry's owner
  # can rename or remove it, and the socket's own owner is checked too).
  # Why a directory above the socket's cannot be trusted, up to / (nil if
  # none): one that another user can write to lets them swap the socket's
  # directory for one of their own. The hub's and the Go client's rule,
  # with the fix.
  def self.ancestors_problem(dir, trusted)
    cur = File.realpath(dir)
    loop do
      parent = File.dirname(cur)
      return nil if parent == cur

      cur = parent
      st = File.stat(cur)
      problem = dir_problem(st, trusted)
      next unless problem

      fix = trusted.include?(st.uid) ? "chmod go-w #{cur} (or chmod +t #{cur})" : "chown #{Process.uid} #{cur} (or root)"
      return "#{cur} above the socket: #{problem} (fix: #{fix})"
    end
  end

  def self.dir_problem(st, trusted)
    unless trusted.include?(st.uid)
      return "directory owned by uid #{st.uid}, not ours (#{Process.uid}), root or an allowed uid"
    end
    if (st.mode & 0o022).nonzero? && (st.mode & S_ISVTX).zero?
      return format("directory mode %04o is writable by group or other (and not sticky)", st.mode & 0o7777)
    end

    nil
  end

  # Why the file at the socket path (lstat: a symlink is not followed) is
  # not our hub's socket (nil if it may be).
  def self.sock_problem(st, trusted)
    unless st.socket?
      kind = st.symlink? ? "a symlink" : "not a socket"
      return format("%s (mode %06o): not our hub's socket", kind, st.mode)
    end
    unless trusted.include?(st.uid)
      return "socket owned by uid #{st.uid}, not ours (#{Process.uid}), root or an allowed uid: not our hub"
    end

    nil
  end

  # Refuses a hub that runs as another user: the peer of the socket
  # (SO_PEERCRED) must be this process's uid, root, or an allowed uid.
  def self.check_peer(sock, path, trusted)
    pid, uid, = sock.getsockopt(Socket::SOL_SOCKET, Socket::SO_PEERCRED).data.unpack("iii")
    return if trusted.include?(uid)

    raise ConnError.new("peer", path, "peer pid #{pid} runs as uid #{uid}, not ours (#{Process.uid}) or root: not our hub")
  end

  # Connects to the hub socket: ConnError op "dial" for a missing socket
  # (ENOENT) or a stale one (ECONNREFUSED), op "peer" for one that is not
  # our hub's. With peer_check (the default) the socket's identity is
  # checked as the Go, Python and Node clients check it: the directory is
  # opened (O_PATH) and checked, the name is lstat'ed in it, the connect
  # goes through that open directory (/proc/self/fd/N/name: a symlink
  # swapped into the path meanwhile changes nothing), then the peer's uid
  # is checked (SO_PEERCRED).
  def self.dial(path, timeout: DEFAULT_CONNECT_TIMEOUT, peer_check: true, allowed_uids: [])
    return connect_unix(path, path, timeout) unless peer_check

    trusted = [Process.uid, 0, *allowed_uids]
    dir, name = File.split(path)
    if name.empty? || name == "." || name == ".." || path.end_with?("/")
      raise ConnError.new("dial", path, "not a socket path")
    end

    begin
      dfd = begin
        File.new(dir, O_PATH)
      rescue Errno::EINVAL
        File.new(dir, File::RDONLY)
      end
    rescue Errno::ENOENT => e
      raise ConnError.new("dial", path, "#{e.message}: the socket's directory is missing: start the hub, or create " \
                                        "it (install -d -m 0755 #{dir}, owned by the hub's user)")
    rescue Errno::EACCES => e
      raise ConnError.new("dial", path, "#{e.message}: uid #{Process.uid} may not reach the socket: every directory of " \
                                        "#{dir} needs search (x) permission for it and the socket write permission " \
                                        "(the hub's --socket-mode 0660 with --socket-group, this user in that group, " \
                                        "and chmod o+x or g+x on the directories)")
    rescue SystemCallError => e
      raise ConnError.new("dial", path, e.message)
    end
    begin
      st = dfd.stat
      raise ConnError.new("dial", path, "#{dir} is not a directory") unless st.directory?

      problem = dir_problem(st, trusted) || ancestors_problem(dir, trusted)
      raise ConnError.new("peer", path, problem) if problem

      via = "/proc/self/fd/#{dfd.fileno}/#{name}"
      via = path unless File.directory?("/proc/self/fd") && via.bytesize < 108
      begin
        before = File.lstat(via)
      rescue Errno::EACCES => e
        raise ConnError.new("dial", path, "#{e.message}: uid #{Process.uid} may not reach the socket: #{dir} needs " \
                                          "search (x) permission for it (chmod o+x or g+x, this user in the group)")
      rescue SystemCallError => e
        raise ConnError.new("dial", path, e.message)
      end
      problem = sock_problem(before, trusted)
      raise ConnError.new("peer", path, problem) if problem

      sock = connect_unix(via, path, timeout)
      begin
        if via == path
          # No /proc: connect by path and require the same socket file
          # afterwards.
          after = File.lstat(path)
          if after.dev != before.dev || after.ino != before.ino
            raise ConnError.new("peer", path, "the socket file changed during the connect: not our hub")
          end
        end
        check_peer(sock, path, trusted)
      rescue StandardError
        sock.close
        raise
      end
      sock
    ensure
      dfd.close
    end
  end

  def self.connect_unix(via, path, timeout)
    sock = Socket.new(:UNIX, :STREAM)
    addr = Socket.sockaddr_un(via)
    begin
      sock.connect_nonblock(addr)
    rescue IO::WaitWritable
      unless sock.wait_writable(timeout)
        sock.close
        raise ConnError.new("dial", path, "connect timed out after #{timeout}s")
      end
      begin
        sock.connect_nonblock(addr)
      rescue Errno::EISCONN
        nil
      end
    end
    sock
  rescue SystemCallError => e
    sock&.close
    raise ConnError.new("dial", path, e.message)
  end
  # The socket checks are the dial's, not an API: Client.new and
  # Listenhub.connect are.
  private_class_method :dir_problem, :sock_problem, :check_peer, :dial, :connect_unix

  # A connection to a listenhub hub. Thread-safe: Action Cable (or any
  # threaded server) may call it from many threads at once.
  #
  # Alive until its first failure, then dead for good (it never reconnects:
  # that is Failover's job): #err says why (ClosedError after close,
  # ConnError: EOF, which is also what an eviction looks like, a malformed
  # frame, a stalled write; AckTimeoutError; NackError; RefusedError).
  #
  # One thread per client reads the socket and calls on_wake(Wake) and
  # on_status(healthy) one at a time in wire order; they must not block
  # (while one runs nothing is read, acks wait, and the hub may evict this
  # process). on_death(err) is called once from that thread when the client
  # died. Writes happen on the caller's thread, bounded by write_timeout.
  #
  # Fork: a Client made before fork() is dead in the child: every call
  # there raises ForkedError at once, and the child's copy of the socket is
  # closed without touching the parent's connection.
  class Client
    include Listener

    Sub = Struct.new(:active, :call, :want_unsub)
    Call = Struct.new(:deadline, :waiters, :done, :err)

    attr_reader :path, :ack_timeout

    def initialize(path, on_wake: nil, on_status: nil, on_death: nil,
                   ack_timeout: DEFAULT_ACK_TIMEOUT, write_timeout: DEFAULT_WRITE_TIMEOUT,
                   connect_timeout: DEFAULT_CONNECT_TIMEOUT, frame_timeout: DEFAULT_FRAME_TIMEOUT,
                   silence_timeout: DEFAULT_SILENCE_TIMEOUT, peer_check: true, allowed_uids: [])
      @path = path
      @ack_timeout = ack_timeout || DEFAULT_ACK_TIMEOUT
      @write_timeout = write_timeout || DEFAULT_WRITE_TIMEOUT
      @frame_timeout = frame_timeout || DEFAULT_FRAME_TIMEOUT
      @silence_timeout = silence_timeout || DEFAULT_SILENCE_TIMEOUT
      @on_wake = wake_handler(on_wake)
      @on_status = on_status
      @on_death = on_death
      @sock = Listenhub.send(:dial, path, timeout: connect_timeout || DEFAULT_CONNECT_TIMEOUT,
                                   peer_check: peer_check, allowed_uids: allowed_uids)
      @pid = Process.pid
      track_for_fork
      @mu = Mutex.new
      @cv = ConditionVariable.new
      @wmu = Mutex.new # one writer at a time; frames leave in @out's order
      @dispatch = Mutex.new # close() waits for a running callback
      @subs = {}
      @out = String.new(encoding: Encoding::BINARY)
      @err = nil
      @healthy = false
      @saw_status = false # a status arrived (see ack_overdue_locked)
      @greeted = false # a frame other than a refusal arrived
      @closing = false
      @reader = Thread.new { read_loop }
      @reader.name = "listenhub-reader" if @reader.respond_to?(:name=)
      @reader.report_on_exception = false
    end

    # Subscribes to q and returns once the hub acked it: from then on every
    # NOTIFY committed on q's channel is delivered (wakes may also arrive
    # before; over-delivery is harmless). A set, not a count: subscribing an
    # acked name returns at once; concurrent calls for one name share one
    # sub frame.
    #
    # Raises InvalidNameError or LimitError (the client stays alive);
    # NackError, AckTimeoutError or ConnError when the hub failed (the client
    # is dead); the client's error when already dead. timeout: (seconds)
    # bounds this caller's wait only: Listenhub::TimeoutError, the client
    # lives on and the subscription is abandoned (unsubscribed once acked
    # unless another caller waits for it).
    def subscribe(q, timeout: nil)
      check_fork!
      problem = Frame.name_problem(q)
      raise InvalidNameError.new(q, problem) if problem

      q = Frame.wire_name(q)
      c, mine = @mu.synchronize do
        raise @err if @err

        join_call_locked(q)
      end
      return unless c

      flush if mine
      mine_deadline = timeout && Listenhub.monotonic + timeout
      @mu.synchronize do
        until c.done
          now = Listenhub.monotonic
          break if ack_overdue_locked(q, c, now)
          if mine_deadline && mine_deadline <= now
            c.waiters -= 1
            @subs[q].want_unsub = true if c.waiters.zero? && @subs[q]
            raise Listenhub::TimeoutError, "listenhub: no answer for #{q.inspect} within #{timeout}s"
          end
          @cv.wait(@mu, [c.deadline, mine_deadline].compact.min - now)
        end
      end
      after_death if @err && !@shut
      raise c.err if c.err

      nil
    end

    # Subscribes to every name of qs at once (all sub frames in one write,
    # then every ack awaited) and returns {q => nil or the error}: a
    # fail-back subscribes a whole set so, without a thread per name.
    # Errors are per name as for subscribe; once the client is dead every
    # name not acked carries its error.
    def subscribe_many(qs)
      check_fork!
      res = {}
      calls = {}
      mine = false
      @mu.synchronize do
        qs.each do |q|
          problem = Frame.name_problem(q)
          if problem
            res[q] = InvalidNameError.new(q, problem)
            next
          end
          q = Frame.wire_name(q)
          if @err
            res[q] = @err
            next
          end
          c, queued = join_call_locked(q)
          mine ||= queued
          if c
            calls[q] = c
          else
            res[q] = nil
          end
        end
      end
      flush if mine
      @mu.synchronize do
        calls.each do |q, c|
          until c.done
            now = Listenhub.monotonic
            break if ack_overdue_locked(q, c, now)
            @cv.wait(@mu, c.deadline - now)
          end
          res[q] = c.err
        end
      end
      after_death if @err && !@shut
      res
    end

    # Drops q and tells the hub (no answer). Never waits for the hub; may be
    # called from a callback. A pending subscribe of q completes, then the
    # client unsubscribes. Unknown names and dead clients: nothing.
    def unsubscribe(q)
      check_fork!
      q = Frame.wire_name(q)
      queued = @mu.synchronize do
        next false if @err

        s = @subs[q]
        next false unless s

        if s.call
          s.want_unsub = true
          next false
        end
        @subs.delete(q)
        @out << Frame.unsub(q)
        true
      end
      flush if queued
      nil
    end

    # Alive, and the hub's last status said its Postgres connection is
    # healthy (false until the first status, which the hub sends on
    # connect).
    def healthy?
      check_fork!
      @err.nil? && @healthy
    end

    # The acked names.
    def subscriptions
      check_fork!
      @mu.synchronize { @subs.select { |_, s| s.active }.keys }
    end

    def alive?
      err.nil?
    end

    # Waits until the client is dead (up to timeout seconds); returns err.
    def wait(timeout = nil)
      check_fork!
      @reader.join(timeout)
      @err
    end

    # Kills the client with ClosedError and closes the socket; the hub drops
    # its subscriptions. Waiting subscribes raise ClosedError. No callback
    # starts once close returned, and one running on another thread is
    # waited for unless wait: false (safe from a callback). Idempotent.
    def close(wait: true)
      return if forked_child_close

      @closing = true
      die(ClosedError.new)
      @dispatch.synchronize { nil } if wait && Thread.current != @reader
      nil
    end

    private

    # Under @mu: the pending call a subscriber of q waits on, counted as one
    # more waiter, and whether its sub frame was queued now (it was not when
    # another caller's call is pending); [nil, false] when q is acked.
    def join_call_locked(q)
      s = (@subs[q] ||= Sub.new(false, nil, false))
      return [nil, false] if s.active && s.call.nil?

      queued = false
      unless s.call
        s.call = Call.new(Listenhub.monotonic + @ack_timeout, 0, false, nil)
        @out << Frame.sub(q)
        queued = true
      end
      s.want_unsub = false
      s.call.waiters += 1
      [s.call, queued]
    end

    # Under @mu: whether the ack deadline of q's call c has passed at now;
    # then the client is dead with AckTimeoutError. While the hub says its
    # Postgres is down the deadline does not count: the ack comes once
    # Postgres is back (the healthy status restarts every deadline).
    def ack_overdue_locked(q, c, now)
      return false if c.deadline > now

      if @saw_status && !@healthy
        c.deadline = now + @ack_timeout
        return false
      end

      die_locked(AckTimeoutError.new(q, @ack_timeout))
      true
    end

    # The child's copy of the socket is closed (never shut down: that would
    # cut the parent's connection too) and nothing of the parent's state is
    # used again.
    def release_in_forked_child
      @sock.close rescue nil # rubocop:disable Style/RescueModifier
    end

    def die(err)
      first = @mu.synchronize do
        next false if @err

        die_locked(err)
        true
      end
      after_death if first
    end

    def die_locked(err)
      @err = err
      @subs.each_value do |s|
        next unless s.call && !s.call.done

        s.call.err = err
        s.call.done = true
      end
      @subs = {}
      @out.clear
      @healthy = false
      @cv.broadcast
    end

    # The reader sees EOF and ends (it closes the socket and calls
    # on_death).
    def after_death
      finish_wakes
      @shut = true
      begin
        @sock.shutdown(Socket::SHUT_RDWR)
      rescue IOError, SystemCallError
        nil
      end
      log_death
    end

    def log_death
      return if @logged

      @logged = true
      if @err.is_a?(ClosedError)
        Listenhub.logger.debug("listenhub client closed")
      else
        Listenhub.logger.warn("listenhub client dead: #{@err.message}")
      end
    end

    # Writes what is queued, in order, within the write timeout (or kills
    # the client). Nothing is written before the hub's first frame (status,
    # or the refusal of this connection): a write into a connection the hub
    # is refusing fails with EPIPE and loses the reason it sent.
    def flush
      @wmu.synchronize do
        buf = @mu.synchronize do
          next nil if @err || !@greeted || @out.empty?

          b = @out.dup
          @out.clear
          b
        end
        write_all(buf) if buf
      end
    end

    def write_all(buf)
      deadline = Listenhub.monotonic + @write_timeout
      until buf.empty?
        n = @sock.write_nonblock(buf, exception: false)
        if n == :wait_writable
          left = deadline - Listenhub.monotonic
          if left <= 0 || !@sock.wait_writable(left)
            die(ConnError.new("write", @path, "stalled for #{@write_timeout}s: the hub stopped reading"))
            return
          end
          next
        end
        buf = buf.byteslice(n, buf.bytesize - n)
      end
    rescue IOError, SystemCallError => e
      die(ConnError.new("write", @path, e.message))
    end

    def read_loop
      dec = Frame::Decoder.new
      heard = Listenhub.monotonic
      loop do
        begin
          if dec.partial_since
            left = dec.partial_since + @frame_timeout - Listenhub.monotonic
            unless left.positive? && @sock.wait_readable(left)
              die(ConnError.new("read", @path, "a frame from the hub stalled: #{dec.buffered} bytes of it in #{@frame_timeout}s (frame timeout)"))
              break
            end
          else
            left = heard + @silence_timeout - Listenhub.monotonic
            unless left.positive? && @sock.wait_readable(left)
              die(ConnError.new("read", @path, "no frame from the hub for #{@silence_timeout}s (silence timeout; " \
                                               "it re-sends its status every few seconds): frozen or wedged"))
              break
            end
          end
          data = @sock.readpartial(65_536)
          heard = Listenhub.monotonic
        rescue EOFError
          why = dec.buffered.positive? ? "unexpected EOF (inside a frame)" : "EOF: the hub closed the connection"
          die(ConnError.new("read", @path, why))
          break
        rescue IOError, SystemCallError => e
          die(ConnError.new("read", @path, e.message))
          break
        end
        dec.feed(data)
        begin
          while (m = dec.next_message)
            handle(m)
            break if @err
          end
        rescue Frame::FrameError => e
          die(ConnError.new("read", @path, e.message))
        end
        break if @err
      end
    rescue StandardError => e # a bug here must not leave callers hanging
      die(Error.new("listenhub: reader crashed: #{e.class}: #{e.message}"))
    ensure
      @wmu.synchronize { @sock.close rescue nil } # rubocop:disable Style/RescueModifier
      guarded("listenhub client: on_death") { @on_death&.call(@err) unless @closing }
    end

    def handle(m)
      t = m["t"]
      q = m["q"]
      unless @greeted
        @greeted = true
        if t == "nack"
          # A nack before anything else is the hub's refusal of this
          # connection (docs/protocol.md); it closes it next.
          die(RefusedError.new(@path, m["error"].is_a?(String) && !m["error"].empty? ? m["error"] : "no reason given"))
          return
        end
        flush
      end
      case t
      when "ack"
        queued = @mu.synchronize do
          s = @subs[q]
          next false unless s&.call

          s.call.done = true
          s.call = nil
          @cv.broadcast
          if s.want_unsub
            @subs.delete(q)
            @out << Frame.unsub(q)
            next true
          end
          s.active = true
          false
        end
        flush if queued
      when "nack"
        reason = m["error"].is_a?(String) ? m["error"] : ""
        q = nacked_name(q, m["q64"])
        if Frame.invalid_name_reason?(reason) || Frame.limit_reason?(reason)
          klass = Frame.limit_reason?(reason) ? LimitError : InvalidNameError
          @mu.synchronize do
            s = @subs[q]
            if s&.call
              s.call.err = klass.new(q, reason)
              s.call.done = true
              s.call = nil
              @subs.delete(q) unless s.active
              @cv.broadcast
            end
          end
        else
          pending = @mu.synchronize { @subs[q]&.call }
          die(NackError.new(q, reason)) if pending
        end
      when "wake"
        held = q.is_a?(String) && @mu.synchronize { @subs.key?(q) }
        deliver(@on_wake, Wake.from(q, m["p"].is_a?(String) ? m["p"] : nil)) if held
      when "status"
        healthy = m["healthy"] == true
        @mu.synchronize do
          was = @healthy
          @healthy = healthy
          @saw_status = true
          if healthy && !was
            # Postgres is back: every sub still waiting gets a whole ack
            # timeout from now.
            deadline = Listenhub.monotonic + @ack_timeout
            @subs.each_value { |s| s.call.deadline = deadline if s.call && !s.call.done }
          end
          @cv.broadcast
        end
        deliver(@on_status, healthy)
      else
        Listenhub.logger.debug("listenhub client: skipping unknown frame type #{t.inspect}")
      end
    end

    # The name a nack answers. A nack for a name that was not valid UTF-8
    # carries the name's bytes as sent in "q64": find the pending sub they
    # match.
    def nacked_name(q, q64)
      return q unless q64.is_a?(String)

      sent = Frame.q64_bytes(q64)
      @mu.synchronize do
        @subs.each { |name, s| return name if s.call && name.b == sent }
      end
      q
    end

    def deliver(cb, arg)
      return unless cb

      @dispatch.synchronize do
        return if @closing

        guarded("listenhub client: callback") { cb.call(arg) }
      end
    end
  end

  # Connects to the hub at path and returns a Client (see Client for the
  # options). Raises ConnError when there is no hub (ENOENT, ECONNREFUSED)
  # or the socket is not our hub's.
  def self.connect(path = nil, **opts)
    Client.new(path || ENV.fetch("LISTENHUB_SOCKET", DEFAULT_SOCKET), **opts)
  end
end
