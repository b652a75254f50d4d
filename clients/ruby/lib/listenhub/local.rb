# frozen_string_literal: true

require "securerandom"
require_relative "errors"
require_relative "listener"
require_relative "frame"

module Listenhub
  # Tags the local listener's backend in pg_stat_activity, distinct from the
  # hub's "listenhub", so an operator sees how many processes fell back.
  DEFAULT_LOCAL_APPLICATION_NAME = "listenhub-local"
  # Bounds the connect and each subscribe's wait for its LISTEN.
  DEFAULT_LOCAL_TIMEOUT = 10.0
  # Bounds the delivery check's wait for its notification.
  DELIVERY_CHECK_TIMEOUT = 2.0

  # The per-process Postgres listener a Failover swaps to: its own LISTEN
  # connection (the pg gem), driven by one thread. Channel = prefix + q +
  # suffix (the hub's --channel-prefix / --channel-suffix), always a quoted
  # identifier. Before it counts as working it proves that notifications
  # arrive on its connection (a transaction-pooling PgBouncer would accept
  # the LISTEN and deliver nothing).
  #
  # connect: a proc returning a fresh PG::Connection (the Action Cable
  # adapter takes one out of Active Record's pool, as the postgresql
  # adapter does); else database_url (or LISTENHUB_DATABASE_URL,
  # DATABASE_URL, the PG* variables).
  class Local
    include Listener

    HEALTH_CHECK_INTERVAL = 5.0
    BACKOFF_MIN = 0.1
    BACKOFF_MAX = 5.0
    Op = Struct.new(:q, :listen, :done, :err, :notify)

    attr_reader :prefix, :suffix

    def initialize(database_url: nil, connect: nil, channel_prefix: "", channel_suffix: "",
                   application_name: DEFAULT_LOCAL_APPLICATION_NAME, timeout: DEFAULT_LOCAL_TIMEOUT,
                   on_wake: nil, on_status: nil, on_death: nil)
      require "pg"
      @prefix = channel_prefix.to_s
      @suffix = channel_suffix.to_s
      @application_name = application_name
      @timeout = timeout || DEFAULT_LOCAL_TIMEOUT
      @url = database_url || ENV["LISTENHUB_DATABASE_URL"] || ENV["DATABASE_URL"] || ""
      @connector = connect || -> { Local.connect(@url, @timeout) }
      @on_wake = wake_handler(on_wake)
      @on_status = on_status
      @on_death = on_death
      @pid = Process.pid
      track_for_fork
      @conn = open_checked
      @mu = Mutex.new
      @cv = ConditionVariable.new
      @ops = []
      @listening = {}
      @err = nil
      @healthy = true
      @kick_r, @kick_w = IO.pipe
      @thread = Thread.new { run }
      @thread.report_on_exception = false
    end

    # A connection for url, with a connect timeout and TCP keepalives (a dead
    # peer is noticed within about half a minute) unless the URL or the PG*
    # variables set them.
    def self.connect(url, timeout = DEFAULT_LOCAL_TIMEOUT)
      given = PG::Connection.conninfo_parse(url).select { |o| o[:val] }.map { |o| o[:keyword] }
      extra = {}
      extra[:connect_timeout] = [2, timeout.to_i].max unless given.include?("connect_timeout") || ENV["PGCONNECT_TIMEOUT"]
      unless given.include?("keepalives")
        extra.merge!(keepalives: 1, keepalives_idle: 10, keepalives_interval: 5, keepalives_count: 3)
      end
      extra.empty? ? PG.connect(url) : PG.connect(url, extra)
    end

    def channel(q)
      @prefix + q + @suffix
    end

    # The pid of the current Postgres backend (tests, diagnostics).
    def backend_pid
      @conn.backend_pid
    end

    # LISTENs to q's channel and returns once Postgres confirmed it.
    # InvalidNameError for a name no channel can carry.
    def subscribe(q, timeout: nil)
      check_fork!
      problem = Frame.name_problem(q) || Frame.channel_problem(channel(q))
      raise InvalidNameError.new(q, problem) if problem

      q = Frame.wire_name(q)
      op = @mu.synchronize do
        raise @err if @err
        return if @listening[q] && !unlisten_queued?(q)

        Op.new(q, true, false, nil).tap { |o| @ops << o }
      end
      wait_op(op, timeout, "local LISTEN of #{q.inspect} not confirmed in time")
    end

    # A round trip on the connection, in order after every LISTEN and
    # UNLISTEN queued before it: every notification the server sent before
    # it has been delivered when it returns (a fail-back drains the local
    # listener so before closing it).
    def sync(timeout: nil)
      check_fork!
      op = @mu.synchronize do
        raise @err if @err

        Op.new(nil, nil, false, nil).tap { |o| @ops << o }
      end
      wait_op(op, timeout, "local round trip not done in time")
    end

    # Commits NOTIFY on q's channel with payload on this connection, in
    # order after the LISTENs and UNLISTENs queued before it (a fail-back's
    # marker: see Failover). :nodoc:
    def notify(q, payload, timeout: nil)
      check_fork!
      op = @mu.synchronize do
        raise @err if @err

        Op.new(q, nil, false, nil, payload).tap { |o| @ops << o }
      end
      wait_op(op, timeout, "local NOTIFY of #{q.inspect} not done in time")
    end

    # Queues an UNLISTEN of q's channel; never blocks.
    def unsubscribe(q)
      check_fork!
      q = Frame.wire_name(q)
      @mu.synchronize do
        return if @err

        @ops << Op.new(q, false, false, nil)
      end
      kick
    end

    def healthy?
      check_fork!
      @err.nil? && @healthy
    end

    # Closes the connection; waiting subscribes raise ClosedError; no
    # callback starts once close returned. Waits for the listener's thread
    # to end (and close the connection) unless wait: false. Idempotent.
    def close(wait: true)
      return if forked_child_close

      @closing = true
      die(ClosedError.new)
      @thread.join(@timeout) if wait && Thread.current != @thread
      nil
    end

    private

    # The child's copy of the Postgres socket is pointed at /dev/null before
    # anything can finish the connection: the pg gem would otherwise send
    # Terminate on it (at close or at exit), ending the parent's session
    # (Active Record does the same in discard!).
    def release_in_forked_child
      begin
        @conn.socket_io.reopen(IO::NULL)
      rescue StandardError
        nil
      end
      [@kick_r, @kick_w].each { |io| io.close rescue nil } # rubocop:disable Style/RescueModifier
    end

    def wait_op(op, timeout, msg)
      kick
      deadline = Listenhub.monotonic + (timeout || @timeout)
      @mu.synchronize do
        until op.done
          left = deadline - Listenhub.monotonic
          raise Listenhub::TimeoutError, "listenhub: #{msg}" if left <= 0

          @cv.wait(@mu, left)
        end
      end
      raise op.err if op.err

      nil
    end

    def unlisten_queued?(q)
      @ops.reverse_each do |op|
        next if op.notify

        return !op.listen if op.q == q
      end
      false
    end

    def die(err)
      ops = @mu.synchronize do
        return false if @err

        @err = err
        o = @ops
        @ops = []
        o.each do |op|
          op.err = err
          op.done = true
        end
        @cv.broadcast
        o
      end
      @healthy = false
      finish_wakes
      kick
      ops
    end

    def kick
      @kick_w.write_nonblock("x", exception: false)
    rescue IOError, SystemCallError
      nil
    end

    def drain_kick
      loop { break unless @kick_r.read_nonblock(512, exception: false).is_a?(String) }
    rescue IOError, SystemCallError
      nil
    end

    def run
      loop_forever
    rescue StandardError => e # a bug here must not leave callers hanging
      Listenhub.logger.error("listenhub local listener crashed: #{e.class}: #{e.message}")
      die(Error.new("listenhub: local listener crashed: #{e.message}"))
    ensure
      begin
        @conn.close unless @conn.finished?
      rescue StandardError
        nil
      end
      [@kick_r, @kick_w].each { |io| io.close rescue nil } # rubocop:disable Style/RescueModifier
      guarded("listenhub local listener: on_death") { @on_death&.call(@err) unless @closing }
    end

    def loop_forever
      last = Listenhub.monotonic
      until @err
        begin
          run_ops
          r, = IO.select([@conn.socket_io, @kick_r], nil, nil, HEALTH_CHECK_INTERVAL)
          drain_kick if r&.include?(@kick_r)
          break if @err

          if r&.include?(@conn.socket_io)
            last = Listenhub.monotonic
            read_notifies
          elsif Listenhub.monotonic - last >= HEALTH_CHECK_INTERVAL
            @conn.exec("SELECT 1")
            last = Listenhub.monotonic
          end
        rescue PG::ConnectionBad, PG::UnableToSend, IOError, SystemCallError => e
          break if @err

          Listenhub.logger.warn("listenhub local listener: connection lost: #{e.message}")
          reconnect
          last = Listenhub.monotonic
        end
      end
    end

    def run_ops
      loop do
        op = @mu.synchronize do
          return if @err || @ops.empty?

          @ops.first
        end
        skip = !op.q.nil? && op.notify.nil? && op.listen == @listening.key?(op.q)
        if op.notify
          begin
            @conn.exec("NOTIFY #{Frame.quote_ident(channel(op.q))}, #{@conn.escape_literal(op.notify)}")
          rescue PG::ConnectionBad, PG::UnableToSend
            raise
          rescue PG::Error => e
            op.err = Error.new("listenhub: local NOTIFY #{op.q.inspect} failed: #{e.message.strip}")
          end
          deliver_pending
        elsif op.q.nil?
          @conn.exec("SELECT 1") # sync: notifications before it are delivered
          deliver_pending
        elsif !skip
          verb = op.listen ? "LISTEN " : "UNLISTEN "
          begin
            @conn.exec(verb + Frame.quote_ident(channel(op.q)))
          rescue PG::ConnectionBad, PG::UnableToSend
            raise # connection trouble: the op stays queued for after the reconnect
          rescue PG::Error => e
            op.err = Error.new("listenhub: local #{verb}#{op.q.inspect} failed: #{e.message.strip}")
          end
          deliver_pending
        end
        @mu.synchronize do
          @ops.shift if @ops.first.equal?(op)
          if op.err.nil? && !op.q.nil? && op.notify.nil?
            op.listen ? @listening[op.q] = true : @listening.delete(op.q)
          end
          op.done = true
          @cv.broadcast
        end
      end
    end

    def read_notifies
      @conn.consume_input
      raise PG::ConnectionBad, "connection lost" if @conn.status != PG::CONNECTION_OK

      deliver_pending
    end

    # Notifications already read (by consume_input, or during a LISTEN).
    def deliver_pending
      while (n = @conn.notifies)
        on_channel(n[:relname], n[:extra])
      end
    end

    def on_channel(ch, payload)
      ch = ch.dup.force_encoding(Encoding::UTF_8)
      if !ch.start_with?(@prefix) || !ch.end_with?(@suffix) || ch.bytesize < @prefix.bytesize + @suffix.bytesize
        Listenhub.logger.debug("listenhub local listener: notification outside the mapping: #{ch.inspect}")
        return
      end
      q = ch.byteslice(@prefix.bytesize, ch.bytesize - @prefix.bytesize - @suffix.bytesize)
      payload = payload&.dup&.force_encoding(Encoding::UTF_8)
      deliver(@on_wake, Wake.from(q, payload))
    end

    def deliver(cb, arg)
      return if cb.nil? || @closing

      guarded("listenhub local listener: callback") { cb.call(arg) }
    end

    # Replaces a lost connection, re-LISTENs the set, reports health and one
    # durable wake per name. Returns when connected or dead.
    def reconnect
      @healthy = false
      deliver(@on_status, false)
      begin
        @conn.close unless @conn.finished?
      rescue StandardError
        nil
      end
      backoff = BACKOFF_MIN
      until @err
        conn = nil
        begin
          conn = open_checked
          names = @mu.synchronize { @listening.keys }
          names.each { |q| conn.exec("LISTEN #{Frame.quote_ident(channel(q))}") }
        rescue StandardError => e
          Listenhub.logger.warn("listenhub local listener: reconnect failed: #{e.message}")
          conn&.close rescue nil # rubocop:disable Style/RescueModifier
          IO.select([@kick_r], nil, nil, backoff)
          drain_kick
          backoff = [backoff * 2, BACKOFF_MAX].min
          next
        end
        @conn = conn
        @healthy = true
        deliver(@on_status, true)
        names.each { |q| deliver(@on_wake, Wake.new(q, nil)) }
        return
      end
    end

    def open_checked
      conn = @connector.call
      begin
        conn.exec("SET application_name = #{conn.escape_literal(@application_name)}") if @application_name
        check_delivery(conn)
      rescue StandardError
        conn.close rescue nil # rubocop:disable Style/RescueModifier
        raise
      end
      conn
    end

    # Proves that notifications arrive on conn (the hub's delivery check),
    # or raises Error saying what it most likely looks at. pg_backend_pid()
    # differing from BackendKeyData's pid means something sits between
    # (PgBouncer makes up its own key): then the NOTIFY comes from a second
    # session, which only a session pooler delivers.
    def check_delivery(conn, timeout = DELIVERY_CHECK_TIMEOUT)
      ch = "listenhub.check.#{Process.pid}.#{SecureRandom.hex(4)}"
      payload = SecureRandom.hex(8)
      conn.exec("LISTEN #{Frame.quote_ident(ch)}")
      server_pid = conn.exec("SELECT pg_backend_pid()").getvalue(0, 0).to_i
      pooled = server_pid != conn.backend_pid
      if pooled
        begin
          other = @connector.call
          other.exec_params("SELECT pg_notify($1, $2)", [ch, payload])
        rescue PG::Error => e
          raise Error, "listenhub: notifications do not arrive on this connection: a pooler sits between " \
                       "(pg_backend_pid() #{server_pid} is not BackendKeyData's #{conn.backend_pid}) and a second " \
                       "connection to check it failed: #{e.message.strip}"
        ensure
          other&.close rescue nil # rubocop:disable Style/RescueModifier
        end
      else
        conn.exec_params("SELECT pg_notify($1, $2)", [ch, payload])
      end
      deadline = Listenhub.monotonic + timeout
      got = false
      until got
        left = deadline - Listenhub.monotonic
        if left <= 0
          if pooled
            raise Error, "listenhub: notifications do not arrive on this connection: a transaction-pooling " \
                         "PgBouncer? use a direct URL (pg_backend_pid() #{server_pid} is not BackendKeyData's " \
                         "#{conn.backend_pid}: a pooler sits between, and a NOTIFY from a second session did not " \
                         "arrive within #{timeout}s)"
          end
          raise Error, "listenhub: notifications do not arrive on this connection: LISTEN and NOTIFY on it " \
                       "brought nothing back within #{timeout}s"
        end
        conn.wait_for_notify(left) do |c, _pid, p|
          got = true if c == ch && p == payload
        end
      end
      conn.exec("UNLISTEN #{Frame.quote_ident(ch)}")
    end
  end
end
