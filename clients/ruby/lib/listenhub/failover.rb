# frozen_string_literal: true

require "monitor"
require "securerandom"
require "set"
require_relative "client"
require_relative "local"

module Listenhub
  # A listener that uses the hub while it can, its own Postgres connection
  # while it cannot, and the hub again once it is back. The same rules as
  # the Go client's client.Failover and the Python and Node Failover.
  #
  # It records the subscription set. On the hub client's failure (connect
  # refused or socket missing: local mode from the start; ack timeout; a
  # nack other than an invalid name or a cap; EOF, which is also what an
  # eviction looks like; a stalled write) it reports status false, opens a
  # Local listener, LISTENs the recorded set (channel = channel_prefix + q +
  # channel_suffix, the hub's mapping), swaps it in, calls
  # on_failover(reason) and delivers one durable wake per recorded name:
  # NOTIFYs committed between the hub's failure and the local LISTENs are
  # lost, durable readers re-read; an ephemeral payload sent in that gap is
  # gone (as in a hub reconnect to Postgres).
  #
  # Fail-back (unless one_way): in local mode it tries the hub again,
  # min_local seconds after the swap, then with backoff (probe_interval
  # doubling up to probe_max_interval, with jitter). An attempt connects a
  # second hub client, waits for it to report healthy, subscribes the whole
  # recorded set and waits for every ack while the local listener keeps
  # delivering; only then does it swap the hub in and close the local
  # listener (make before break: a NOTIFY in the overlap may be delivered
  # twice, none is lost), call on_failback and deliver one durable wake per
  # recorded name.
  #
  # Threads: the hub client's reader; in local mode the local listener's
  # thread and one fail-back thread. None per subscription. Callbacks
  # (on_wake(Wake), on_status(healthy)) run one at a time across hub and
  # local and must not block.
  #
  # Fork: a Failover made before fork() raises ForkedError at once in the
  # child (every call), and the child's copies of its sockets are closed
  # without touching the parent's connections.
  class Failover
    include Listener

    DEFAULT_MIN_LOCAL = 5.0
    DEFAULT_PROBE_INTERVAL = 1.0
    DEFAULT_PROBE_MAX_INTERVAL = 30.0
    # Each wait between attempts is scaled by a random factor in [0.8, 1.2],
    # so that the processes of a host do not all knock on a restarted hub at
    # once.
    PROBE_JITTER = 0.2

    attr_reader :socket_path

    def initialize(socket_path = nil, database_url: nil, connect: nil, channel_prefix: "", channel_suffix: "",
                   application_name: DEFAULT_LOCAL_APPLICATION_NAME, ack_timeout: DEFAULT_ACK_TIMEOUT,
                   write_timeout: DEFAULT_WRITE_TIMEOUT, connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                   local_timeout: DEFAULT_LOCAL_TIMEOUT, peer_check: true, allowed_uids: [], one_way: false,
                   min_local: DEFAULT_MIN_LOCAL, probe_interval: DEFAULT_PROBE_INTERVAL,
                   probe_max_interval: DEFAULT_PROBE_MAX_INTERVAL, check_database: true,
                   silence_timeout: DEFAULT_SILENCE_TIMEOUT,
                   on_wake: nil, on_status: nil, on_failover: nil, on_failback: nil)
      @socket_path = socket_path || ENV.fetch("LISTENHUB_SOCKET", DEFAULT_SOCKET)
      @ack_timeout = ack_timeout || DEFAULT_ACK_TIMEOUT
      @hub_args = { ack_timeout: @ack_timeout, write_timeout: write_timeout, connect_timeout: connect_timeout,
                    silence_timeout: silence_timeout,
                    peer_check: peer_check, allowed_uids: allowed_uids }
      @local_args = { database_url: database_url, connect: connect, channel_prefix: channel_prefix,
                      channel_suffix: channel_suffix, application_name: application_name, timeout: local_timeout }
      @local_timeout = local_timeout || DEFAULT_LOCAL_TIMEOUT
      @one_way = one_way
      @min_local = min_local
      @probe_interval = probe_interval
      @probe_max_interval = [probe_max_interval, probe_interval].max
      @on_wake = wake_handler(on_wake)
      @on_status = on_status
      @on_failover = on_failover
      @on_failback = on_failback
      @pid = Process.pid
      track_for_fork
      @dispatch = Monitor.new # one callback at a time across hub and local
      @mu = Mutex.new
      @cv = ConditionVariable.new # a swap ended, a candidate reported healthy, death
      @mode = :hub
      @reason = nil
      @hub = nil
      @local = nil
      @cand = nil
      @subs = Set.new
      @swapping = false
      @err = nil
      @cut = nil # a fail-back's switch point (Cut), under @dispatch
      @probe = nil # the start's database check: [q, token, latch], under @dispatch
      @check_database = check_database
      @wrong_database = false

      begin
        hub, state = new_hub(true)
        check_database(hub, state)
      rescue ConnError, OtherDatabaseError => e
        if e.is_a?(OtherDatabaseError)
          Listenhub.logger.error(e.message)
        else
          Listenhub.logger.warn("listenhub: hub unreachable (#{e.message}), listening locally")
        end
        begin
          local = new_local
        rescue StandardError => le
          raise FailoverError.new(e, le)
        end
        @mu.synchronize do
          @mode = :local
          @reason = e
          @local = local
        end
        deliver(@on_status, local.healthy?)
        start_local(local)
        return
      end
      @mu.synchronize { @hub = hub }
      hub_died(hub, hub.err) if hub.err
      Thread.new { verify_later(hub, state) } if state[:unverified]
    end

    # :hub or :local: where wakes come from now.
    def mode
      check_fork!
      @mu.synchronize { @mode }
    end

    # Why the last failover happened (nil on the hub).
    def reason
      @mu.synchronize { @reason }
    end

    # Records q and subscribes the current listener; returns once LISTEN is
    # active (hub ack, or local LISTEN). In hub mode a hub failure triggers
    # the failover and the subscription is made locally. Raises
    # InvalidNameError, LimitError, FailoverError, ClosedError, ForkedError,
    # Listenhub::TimeoutError (this caller's timeout).
    def subscribe(q, timeout: nil)
      check_fork!
      problem = Frame.name_problem(q)
      raise InvalidNameError.new(q, problem) if problem

      q = Frame.wire_name(q)
      deadline = timeout && Listenhub.monotonic + timeout
      loop do
        mode, hub, local = @mu.synchronize do
          raise @err if @err

          @subs << q # before the call: a swap meanwhile includes q
          wait_locked(deadline) { @swapping }
          raise @err if @err

          [@mode, @hub, @local]
        end
        cur = mode == :hub ? hub : local
        left = deadline && deadline - Listenhub.monotonic
        begin
          cur.subscribe(q, timeout: left)
          return nil
        rescue InvalidNameError, LimitError # final for this name
          forget(q)
          raise
        rescue Listenhub::TimeoutError
          raise
        rescue Error => e
          if mode == :hub && cur.err && !cur.err.is_a?(ClosedError)
            # The hub failed under us: its reader starts the failover; wait
            # for it to replace the hub, then subscribe the local listener.
            @mu.synchronize { wait_locked(deadline) { !@err && @hub.equal?(cur) } }
            next
          end
          replaced = @mu.synchronize { @err.nil? && !cur.equal?(@hub) && !cur.equal?(@local) }
          raise(@err || e) unless replaced
          # Closed by a swap (a fail-back closing the local listener):
          # subscribe the new current one.
        end
      end
    end

    # Drops q from the recorded set and the current listener. Never blocks.
    def unsubscribe(q)
      check_fork!
      q = Frame.wire_name(q)
      cur = @mu.synchronize do
        @subs.delete(q)
        next nil if @err || @swapping

        @mode == :hub ? @hub : @local
      end
      cur&.unsubscribe(q)
      nil
    end

    def healthy?
      check_fork!
      cur = @mu.synchronize do
        next nil if @err || @swapping

        @mode == :hub ? @hub : @local
      end
      cur ? cur.healthy? : false
    end

    # The recorded set.
    def subscriptions
      check_fork!
      @mu.synchronize { @subs.to_a }
    end

    # The pid of the local listener's backend (nil in hub mode).
    def local_backend_pid
      @mu.synchronize { @local }&.backend_pid
    end

    # Closes whichever listeners exist. No callback starts once close
    # returned (each checks the Failover's state first). Idempotent; safe
    # from a callback: from one it waits for none of the listeners' threads
    # (one of them may be waiting for that very callback to return).
    def close
      return if forked_child_close

      hub, local, cand = @mu.synchronize do
        return nil if @err

        @err = ClosedError.new
        @cv.broadcast
        [@hub, @local, @cand]
      end
      wait = !@dispatch.mon_owned?
      [hub, local, cand].compact.each { |x| x.close(wait: wait) }
      @failback&.join(5) if wait && Thread.current != @failback
      nil
    end

    private

    def release_in_forked_child
      [@hub, @local, @cand].compact.each do |x|
        x.close
      rescue StandardError
        nil
      end
    end

    # Waits (holding @mu) while the block is true, until deadline (nil: the
    # failover's own bound).
    def wait_locked(deadline)
      deadline ||= Listenhub.monotonic + @ack_timeout + @local_timeout + 5
      while !@err && yield
        left = deadline - Listenhub.monotonic
        raise Listenhub::TimeoutError, "listenhub: failover not finished in time" if left <= 0

        @cv.wait(@mu, left)
      end
    end

    # A hub client whose statuses are delivered only while it is the
    # current one (state[:current]); state[:healthy] turns true at its first
    # healthy status.
    def new_hub(current)
      state = { current: current, healthy: false }
      holder = []
      on_status = lambda do |h|
        if h
          @mu.synchronize do
            state[:healthy] = true
            @cv.broadcast
          end
        end
        deliver(@on_status, h) if state[:current]
      end
      c = Client.new(@socket_path, on_wake: ->(w) { hub_wake(holder[0], state, w) }, on_status: on_status,
                                   on_death: ->(e) { holder[0] && hub_died(holder[0], e) }, **@hub_args)
      holder[0] = c
      [c, state]
    end

    # At start: the hub must hear the database this listener was given. A
    # private name is subscribed through it, a NOTIFY of it committed on a
    # short connection of this process's own, and it must come back
    # through the hub within the ack timeout; if not, the hub is closed and
    # OtherDatabaseError raised. A hub not healthy within the ack timeout
    # (its Postgres is down) is not trusted either: it is left unverified,
    # its wakes held, until verify_later has checked it once it says
    # healthy. A database this process cannot reach leaves the hub trusted.
    # check_database: false leaves the check to the owner (the Rails
    # adapter probes through Active Record's connection itself).
    def check_database(hub, state)
      return unless @check_database && cut_fits? && hub.err.nil?

      deadline = Listenhub.monotonic + @ack_timeout
      healthy = @mu.synchronize do
        until state[:healthy] || (left = deadline - Listenhub.monotonic) <= 0 || hub.err
          @cv.wait(@mu, left)
        end
        state[:healthy]
      end
      unless healthy
        @dispatch.synchronize { state[:unverified], state[:held] = true, [] } if hub.err.nil?
        return
      end
      probe_database(hub)
    end

    # The start's check, once the hub first says healthy: verified, the held
    # wakes are delivered; a hub on another database is left for a local
    # listener (reason OtherDatabaseError), its held wakes, another
    # database's, dropped.
    def verify_later(hub, state)
      @mu.synchronize do
        @cv.wait(@mu, 0.5) until state[:healthy] || hub.err || @err
      end
      return release_held(state, false) if hub.err || @err

      begin
        probe_database(hub)
      rescue OtherDatabaseError => e
        Listenhub.logger.error(e.message)
        release_held(state, false)
        go = @mu.synchronize do
          next false if @err || @mode != :hub || !@hub.equal?(hub) || @swapping

          @swapping = true
        end
        failover(e) if go
        return
      end
      release_held(state, true)
    rescue StandardError => e
      Listenhub.logger.error("listenhub: database check failed: #{e.class}: #{e.message}")
      release_held(state, true)
    end

    def release_held(state, deliver_them)
      @dispatch.synchronize do
        held = state[:held] || []
        state[:unverified] = false
        state[:held] = []
        held.each { |w| deliver(@on_wake, w) } if deliver_them && state[:current]
      end
      nil
    end

    # A one-shot event with a timed wait (Queue#pop takes no timeout before
    # Ruby 3.2).
    class Latch
      def initialize
        @mu = Mutex.new
        @cv = ConditionVariable.new
        @open = false
      end

      def open
        @mu.synchronize do
          @open = true
          @cv.broadcast
        end
      end

      # Whether it opened within timeout seconds.
      def wait(timeout)
        deadline = Listenhub.monotonic + timeout
        @mu.synchronize do
          until @open || (left = deadline - Listenhub.monotonic) <= 0
            @cv.wait(@mu, left)
          end
          @open
        end
      end
    end
    private_constant :Latch

    # The check itself (see check_database).
    def probe_database(hub)
      token = SecureRandom.hex(8)
      q = "lh.db.#{token[0, 8]}"
      came = Latch.new
      @dispatch.synchronize { @probe = [q, token, came] }
      begin
        begin
          hub.subscribe(q, timeout: @ack_timeout)
        rescue StandardError
          return # the hub's own failure shows elsewhere
        end
        database = begin
          conn = @local_args[:connect] ? @local_args[:connect].call : Local.connect(local_url, @local_timeout)
          begin
            conn.exec_params("SELECT pg_notify($1, $2)",
                             [@local_args[:channel_prefix].to_s + q + @local_args[:channel_suffix].to_s, token])
            conn.db
          ensure
            conn.close
          end
        rescue StandardError
          nil
        end
        return if database.nil? || came.wait(@ack_timeout)

        @wrong_database = true
        hub.close
        raise OtherDatabaseError.new(@socket_path, database, @ack_timeout)
      ensure
        @dispatch.synchronize { @probe = nil }
        hub.unsubscribe(q) if hub.err.nil?
      end
    end

    def local_url
      @local_args[:database_url] || ENV["LISTENHUB_DATABASE_URL"] || ENV["DATABASE_URL"] || ""
    end

    def new_local
      holder = []
      local = Local.new(**@local_args,
                        on_wake: ->(w) { local_wake(w) },
                        on_status: ->(h) { local_status(holder[0], h) },
                        on_death: ->(e) { holder[0] && local_died(holder[0], e) })
      holder[0] = local
      local
    end

    # The cut of a fail-back. Both listeners receive one Postgres's
    # notifications in commit order, so a marker NOTIFY committed on the
    # local connection while both listen is at the same place in both
    # streams: the local listener's wakes are delivered up to it, the
    # hub's after it (held in buf until the local listener has passed
    # it), and none twice or lost. A marker the hub never delivers means a
    # hub on another database, and the fail-back is refused; the local
    # listener's wakes after its marker wait in held until the hub passes
    # its own, and are delivered when the fail-back is given up first
    # (abandon), so a refused fail-back loses nothing either.
    Cut = Struct.new(:hub, :q, :token, :hub_past, :local_past, :buf, :mu, :cv, :held) do
      def both? = hub_past && local_past

      def passed
        mu.synchronize { cv.broadcast } if both?
      end
    end
    private_constant :Cut

    # 63 bytes: the marker must fit between the hub's prefix and suffix.
    def cut_fits?
      @local_args[:channel_prefix].to_s.bytesize + "lh.cut.".bytesize + 8 +
        @local_args[:channel_suffix].to_s.bytesize <= 63
    end

    # A wake of hub client c: through the cut while c is a fail-back's
    # candidate; delivered when c is current; dropped otherwise (a
    # candidate given up: the local listener delivered the same).
    def hub_wake(c, state, w)
      @dispatch.synchronize do
        if (probe = @probe) && w.name == probe[0]
          probe[2].open if w.payload == probe[1]
          return
        end
        if state[:unverified]
          state[:held] << w # verify_later delivers or drops them
          return
        end
        cut = @cut
        if cut && cut.hub.equal?(c)
          if w.name == cut.q
            if w.payload == cut.token && !cut.hub_past
              cut.hub_past = true
              cut.held.clear # the hub delivers them from here on
              cut.passed
            end
            return
          end
          return unless cut.hub_past

          unless cut.local_past
            cut.buf << w
            return
          end
        elsif !state[:current]
          return
        end
        deliver(@on_wake, w)
      end
    end

    # A wake of the local listener: during a cut, up to the marker only.
    def local_wake(w)
      @dispatch.synchronize do
        cut = @cut
        if cut
          if w.name == cut.q
            if w.payload == cut.token && !cut.local_past
              cut.local_past = true
              cut.buf.each { |b| deliver(@on_wake, b) }
              cut.buf.clear
              cut.passed
            end
            return
          end
          if cut.local_past && !cut.hub_past
            cut.held << w # the hub's, once it passes; ours if it never does
            return
          end
          return if cut.local_past
        end
        deliver(@on_wake, w)
      end
    end

    def set_cut(cut)
      @dispatch.synchronize { @cut = cut }
    end

    # Removes the cut of a fail-back given up and makes up for what it held
    # back: the local listener's wakes after its marker when the hub never
    # passed its own (a hub on another database), in order, before any
    # later one; when both had passed, a durable wake per name (the wakes
    # in flight as the hub stopped delivering may have reached neither
    # side).
    def abandon(cut)
      owed = @dispatch.synchronize do
        next false unless @cut.equal?(cut)

        @cut = nil
        cut.held.each { |w| deliver(@on_wake, w) } if cut.local_past && !cut.hub_past
        cut.held.clear
        cut.local_past && cut.hub_past
      end
      return unless owed

      @mu.synchronize { @subs.to_a.sort }.each { |q| deliver(@on_wake, Wake.new(q, nil)) }
    end

    # Commits the marker and waits until both listeners delivered it; nil
    # when they did, else why not.
    def send_marker(local, cut)
      local.notify(cut.q, cut.token, timeout: @ack_timeout)
      deadline = Listenhub.monotonic + @ack_timeout
      cut.mu.synchronize do
        # The flags are read without @dispatch: its holder may be waiting
        # for cut.mu (passed), and they are set before it is taken.
        while !cut.both? && (left = deadline - Listenhub.monotonic).positive?
          cut.cv.wait(cut.mu, left)
        end
      end
      return nil if cut.both?
      return "the local listener did not deliver the fail-back marker in time" if cut.hub_past

      msg = "listenhub: the hub at #{@socket_path} does not deliver this database's notifications (a marker " \
            "did not come back through it within #{@ack_timeout}s): it serves another database or cluster; " \
            "staying on the local listener"
      if @wrong_database
        Listenhub.logger.debug(msg)
      else
        @wrong_database = true
        Listenhub.logger.error(msg)
      end
      msg
    rescue Error => e
      e.message
    end

    def hub_died(hub, err)
      return if err.nil? || err.is_a?(ClosedError)

      go = @mu.synchronize do
        next false if @err || @mode != :hub || !@hub.equal?(hub) || @swapping

        @swapping = true
        true
      end
      failover(err) if go
    end

    def local_died(local, err)
      return if err.nil? || err.is_a?(ClosedError)

      current = @mu.synchronize { @local.equal?(local) }
      die(FailoverError.new(@reason, err)) if current
    end

    def local_status(local, healthy)
      current = @mu.synchronize { @mode == :local && @err.nil? && @local.equal?(local) }
      deliver(@on_status, healthy) if current
    end

    def forget(q)
      @mu.synchronize { @subs.delete(q) }
    end

    def end_swap
      @mu.synchronize do
        @swapping = false
        @cv.broadcast
      end
    end

    def failover(reason)
      Listenhub.logger.warn("listenhub: hub failed (#{reason.message}), failing over to a local listener")
      deliver(@on_status, false)
      begin
        local = new_local
      rescue StandardError => e
        end_swap
        die(FailoverError.new(reason, e))
        return
      end
      listened = Set.new
      extra = recorded = nil
      loop do
        todo, closed = @mu.synchronize do
          t = @subs - listened
          if t.empty? && @err.nil?
            extra = listened - @subs
            recorded = @subs.to_a.sort
            @mode = :local
            @reason = reason
            @local = local
            @hub = nil
          end
          [t, !@err.nil?]
        end
        if closed
          local.close
          end_swap
          return
        end
        break if todo.empty?

        todo.sort.each do |q|
          local.subscribe(q)
          listened << q
        rescue InvalidNameError
          forget(q)
        rescue StandardError => e
          local.close
          end_swap
          die(FailoverError.new(reason, "subscribe #{q.inspect}: #{e.message}"))
          return
        end
      end
      end_swap
      extra.each { |q| local.unsubscribe(q) }
      Listenhub.logger.info("listenhub: local listener active, #{recorded.size} subscriptions")
      call(@on_failover, reason)
      deliver(@on_status, local.healthy?)
      recorded.each { |q| deliver(@on_wake, Wake.new(q, nil)) }
      start_local(local)
    end

    # local is current: try the hub again (unless one_way).
    def start_local(local)
      return if @one_way

      @failback = Thread.new { failback_loop(local) }
      @failback.report_on_exception = false
    end

    def failback_loop(local)
      wait = @min_local
      nxt = @probe_interval
      attempt = 0
      loop do
        closed = @mu.synchronize do
          deadline = Listenhub.monotonic + wait
          while @err.nil? && (left = deadline - Listenhub.monotonic).positive?
            @cv.wait(@mu, left)
          end
          !@err.nil?
        end
        return if closed

        attempt += 1
        return if failback(local, attempt)

        wait = nxt * (1 - PROBE_JITTER + 2 * PROBE_JITTER * rand)
        nxt = [2 * nxt, @probe_max_interval].min
      end
    rescue StandardError => e
      Listenhub.logger.error("listenhub: fail-back loop crashed: #{e.class}: #{e.message}")
    end

    # One attempt to return to the hub; true means stop trying (back on the
    # hub, local no longer current, or dead).
    def failback(local, attempt)
      return true if @mu.synchronize { @err || @swapping || @mode != :local || !@local.equal?(local) }

      begin
        cand, state = new_hub(false)
      rescue ConnError => e
        Listenhub.logger.debug("listenhub: fail-back attempt #{attempt}: #{e.message}")
        return false
      end
      swapped = false
      recorded = nil
      cut = nil
      begin
        @mu.synchronize do
          return true if @err

          @cand = cand
          deadline = Listenhub.monotonic + @ack_timeout
          while @err.nil? && !state[:healthy] && cand.alive? && (left = deadline - Listenhub.monotonic).positive?
            @cv.wait(@mu, left)
          end
        end
        unless state[:healthy] && cand.alive?
          Listenhub.logger.debug("listenhub: fail-back attempt #{attempt}: hub not healthy")
          return false
        end
        Listenhub.logger.info("listenhub: hub is back, subscribing it before leaving the local listener")
        if cut_fits?
          b = SecureRandom.hex(8)
          cut = Cut.new(cand, "lh.cut.#{b[0, 8]}", b, false, false, [], Mutex.new, ConditionVariable.new, [])
          set_cut(cut)
          begin
            local.subscribe(cut.q, timeout: @ack_timeout)
            cand.subscribe(cut.q, timeout: @ack_timeout)
          rescue Error => e
            Listenhub.logger.debug("listenhub: fail-back attempt #{attempt}: marker: #{e.message}")
            return false
          end
        end
        marked_at = nil
        acked = Set.new
        drained = false
        loop do
          todo = @mu.synchronize do
            return true if @err

            @subs - acked
          end
          if todo.empty? && !drained
            # A NOTIFY committed just before the hub's LISTEN of its name
            # reaches only the local listener: let it arrive before the
            # local listener is closed.
            begin
              local.sync(timeout: @ack_timeout)
            rescue StandardError => e
              Listenhub.logger.debug("listenhub: local listener not drained before the fail-back: #{e.message}")
            end
            drained = true
            next # names subscribed meanwhile need their acks first
          end
          if cut && marked_at.nil? && @mu.synchronize { (@subs - acked).empty? }
            why = send_marker(local, cut)
            if why
              Listenhub.logger.debug("listenhub: fail-back attempt #{attempt}: #{why}")
              return false
            end
            marked_at = acked.size
            next
          end
          done = @mu.synchronize do
            return true if @err

            todo = @subs - acked
            if todo.empty?
              return false unless cand.healthy?
              return false if cut && acked.size != marked_at # a name acked after the marker: start again

              (acked - @subs).each { |q| cand.unsubscribe(q) }
              recorded = @subs.to_a.sort
              @mode = :hub
              @reason = nil
              @hub = cand
              @local = nil
              @cand = nil
              state[:current] = true
              swapped = true
            end
            swapped
          end
          break if done

          cand.subscribe_many(todo.to_a.sort).each do |q, err|
            case err
            when nil then acked << q
            when LimitError
              Listenhub.logger.warn("listenhub: fail-back: #{err.message}")
              return false
            when InvalidNameError then forget(q)
            else
              Listenhub.logger.debug("listenhub: fail-back attempt #{attempt}: #{err.message}")
              return false
            end
          end
          drained = false
        end
      ensure
        unless swapped
          @mu.synchronize { @cand = nil if @cand.equal?(cand) }
          cand.close
          if cut
            abandon(cut)
            local.unsubscribe(cut.q) rescue nil # rubocop:disable Style/RescueModifier
          end
        end
      end
      local.close # break, after make
      if cut
        set_cut(nil)
        cand.unsubscribe(cut.q)
      end
      hub_died(cand, cand.err) if cand.err # died before it was current
      Listenhub.logger.info("listenhub: back on the hub, local listener closed (attempt #{attempt})")
      call(@on_failback)
      deliver(@on_status, cand.healthy?)
      recorded.each { |q| deliver(@on_wake, Wake.new(q, nil)) }
      true
    end

    def die(err)
      hub, local, cand = @mu.synchronize do
        return if @err

        @err = err
        @cv.broadcast
        [@hub, @local, @cand]
      end
      Listenhub.logger.error("listenhub: no listener left: #{err.message}")
      finish_wakes
      [hub, local, cand].compact.each(&:close)
      deliver(@on_status, false, force: true)
    end

    def call(cb, *args)
      return unless cb

      @dispatch.synchronize do
        return if @err

        cb.call(*args)
      end
    rescue StandardError => e
      Listenhub.logger.error("listenhub: callback raised: #{e.class}: #{e.message}")
    end

    def deliver(cb, arg, force: false)
      return unless cb

      @dispatch.synchronize do
        return if @err.is_a?(ClosedError) || (@err && !force)

        cb.call(arg)
      end
    rescue StandardError => e
      Listenhub.logger.error("listenhub: callback raised: #{e.class}: #{e.message}")
    end
  end
end
