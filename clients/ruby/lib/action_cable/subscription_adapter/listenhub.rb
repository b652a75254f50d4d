# frozen_string_literal: true

# The Action Cable subscription adapter of listenhub: `adapter: listenhub` in
# config/cable.yml. A drop-in for `adapter: postgresql` that LISTENs through
# the host's listenhub hub, so that a Puma (or any preforking server) costs
# one LISTEN backend per host instead of one per worker process.
#
# config/cable.yml:
#
#   production:
#     adapter: listenhub
#     socket: /run/listenhub/listenhub.sock # default: LISTENHUB_SOCKET, else this path
#     channel_prefix: myapp_production      # Action Cable's, as for postgresql
#     # hub_channel_prefix / hub_channel_suffix: the hub's --channel-prefix /
#     # --channel-suffix, when it runs with a mapping (empty by default)
#
# Broadcasts NOTIFY through the app's Active Record connection exactly as the
# postgresql adapter does (the same channel identifier, the same 8000-byte
# payload limit and error). Subscriptions go through the hub; the success
# callback runs once the hub acked, that is once LISTEN is active. Without a
# hub, or when it dies or evicts this process, the adapter LISTENs on a
# connection of its own (taken out of Active Record's pool, as the
# postgresql adapter takes one), and returns to the hub once it is back.

require "digest/sha1"
require "securerandom"
require "action_cable"
require "active_support/core_ext/hash/indifferent_access"
require_relative "../../listenhub"

module ActionCable
  module SubscriptionAdapter
    class Listenhub < Base
      prepend ChannelPrefix

      # Postgres truncates identifiers at NAMEDATALEN-1 bytes.
      MAX_CHANNEL_BYTES = 63
      SHA1_HEX_BYTES = 40

      def initialize(*)
        super
        cable = @server.config.cable.to_h.with_indifferent_access
        @socket = (cable[:socket] || ENV["LISTENHUB_SOCKET"] || ::Listenhub::DEFAULT_SOCKET).to_s
        @hub_prefix = cable[:hub_channel_prefix].to_s
        @hub_suffix = cable[:hub_channel_suffix].to_s
        if @hub_prefix.bytesize + @hub_suffix.bytesize + SHA1_HEX_BYTES > MAX_CHANNEL_BYTES
          raise ArgumentError, "listenhub adapter: hub_channel_prefix and hub_channel_suffix leave less than " \
                               "#{SHA1_HEX_BYTES} bytes of Postgres's #{MAX_CHANNEL_BYTES}-byte channel names"
        end
        @options = {
          ack_timeout: cable[:ack_timeout], min_local: cable[:min_local], probe_interval: cable[:probe_interval],
          probe_max_interval: cable[:probe_max_interval], one_way: cable[:one_way],
          application_name: cable[:id] || ::Listenhub::DEFAULT_LOCAL_APPLICATION_NAME
        }.compact
        @listener = nil
        ::Listenhub.logger = logger if logger && !::Listenhub.logger_set?
      end

      # How often a hub refused for serving another database is tried
      # again (cable.yml probe_max_interval, default 30 s).
      def hub_recheck_interval # :nodoc:
        (@options[:probe_max_interval] || 30).to_f
      end

      def broadcast(channel, payload)
        with_broadcast_connection do |pg_conn|
          pg_conn.exec("NOTIFY #{pg_conn.escape_identifier(pg_channel(channel))}, '#{pg_conn.escape_string(payload)}'")
        end
      end

      def subscribe(channel, callback, success_callback = nil)
        listener.add_subscriber(channel_identifier(channel), callback, success_callback)
      end

      def unsubscribe(channel, callback)
        listener.remove_subscriber(channel_identifier(channel), callback)
      end

      def shutdown
        l = @server.mutex.synchronize do
          x = @listener
          @listener = nil
          x
        end
        l&.shutdown
      end

      # The Postgres channel a (prefixed) Action Cable channel maps to: the
      # hub's prefix and suffix around the identifier.
      def pg_channel(channel)
        @hub_prefix + channel_identifier(channel) + @hub_suffix
      end

      # The postgresql adapter's rule (a name over 63 characters becomes its
      # SHA1 hex digest), applied to the whole Postgres channel: the digest
      # also replaces a name that fits in 63 characters but not in 63 bytes
      # once the hub's prefix and suffix are around it (Postgres would cut
      # it, the hub refuses it).
      def channel_identifier(channel)
        ident = channel.size > MAX_CHANNEL_BYTES ? Digest::SHA1.hexdigest(channel) : channel
        if @hub_prefix.bytesize + ident.bytesize + @hub_suffix.bytesize > MAX_CHANNEL_BYTES
          ident = Digest::SHA1.hexdigest(channel)
        end
        ident
      end

      # A Failover to the hub whose local listener takes its connection out
      # of Active Record's pool (the listener owns it from then on).
      def new_failover(on_wake:, on_status:) # :nodoc:
        ::Listenhub::Failover.new(@socket, channel_prefix: @hub_prefix, channel_suffix: @hub_suffix,
                                           connect: -> { subscriptions_connection },
                                           check_database: false, # verify_database probes it
                                           on_wake: on_wake, on_status: on_status, **@options)
      end

      # A listener on a connection of Active Record's own, never the hub:
      # for a hub that does not hear this app's database.
      def new_local(on_wake:, on_status:) # :nodoc:
        ::Listenhub::Local.new(channel_prefix: @hub_prefix, channel_suffix: @hub_suffix,
                               connect: -> { subscriptions_connection },
                               application_name: @options[:application_name],
                               on_wake: on_wake, on_status: on_status)
      end

      # What names the app's database in a log line: name, host and port of
      # Active Record's connection.
      def database_description # :nodoc:
        c = ActiveRecord::Base.connection_db_config.configuration_hash
        "#{c[:database]} on #{c[:host] || "the local socket"}#{":#{c[:port]}" if c[:port]}"
      rescue StandardError
        "the app's database"
      end

      attr_reader :socket # :nodoc:

      def subscriptions_connection # :nodoc:
        ar_conn = ActiveRecord::Base.connection_pool.checkout.tap do |conn|
          # The local listener takes ownership of this database connection.
          ActiveRecord::Base.connection_pool.remove(conn)
        end
        pg_conn = ar_conn.raw_connection
        verify!(pg_conn)
        pg_conn
      end

      def with_broadcast_connection # :nodoc:
        ActiveRecord::Base.connection_pool.with_connection do |ar_conn|
          pg_conn = ar_conn.raw_connection
          verify!(pg_conn)
          yield pg_conn
        end
      end

      private

      # Made lazily, so a server that preloads the app and forks (Puma's
      # preload_app!) gets one per worker: a listener inherited across fork
      # is dropped in the child (its sockets closed there without touching
      # the parent's) and a new one is made.
      def listener
        @server.mutex.synchronize do
          if @listener && @listener.pid != Process.pid
            @listener.forked
            @listener = nil
          end
          @listener ||= Listener.new(self, @server.event_loop, @server.logger)
        end
      end

      def verify!(pg_conn)
        return if pg_conn.is_a?(PG::Connection)

        raise "The Active Record database must be PostgreSQL in order to use the listenhub Action Cable storage adapter"
      end

      # The subscriber map of one process. One thread runs the subscribes
      # and unsubscribes in order (a subscribe waits for the hub's ack, or
      # for the local LISTEN), as the postgresql adapter's listener thread
      # does; wakes arrive on the hub client's reader thread and go to the
      # callbacks through the server's event loop. No thread per
      # subscription.
      class Listener < SubscriberMap
        RETRY_MIN = 0.5
        RETRY_MAX = 10.0

        attr_reader :pid

        def initialize(adapter, event_loop, logger)
          super()
          @adapter = adapter
          @event_loop = event_loop
          @logger = logger
          @pid = Process.pid
          @ops = []
          @mu = Mutex.new
          @cv = ConditionVariable.new
          @failover = nil
          @verified = nil # the Failover (or Local) whose hub heard the probe
          @probe = nil    # [name, token, came] while a probe goes round
          @probe_mu = Mutex.new
          @stopping = false
          @thread = Thread.new { run }
          @thread.report_on_exception = false
        end

        def add_channel(channel, on_success)
          push([:listen, channel, on_success])
        end

        def remove_channel(channel)
          push([:unlisten, channel])
        end

        def invoke_callback(*)
          @event_loop.post { super }
        end

        # Stops the thread (a subscribe waiting for an ack is cut short by
        # closing the Failover under it) and closes everything.
        def shutdown
          @stopping = true
          push([:shutdown])
          @failover&.close
          @thread.join(10)
          @failover&.close
        end

        # In a forked child: nothing of the parent's is used or shut down.
        def forked
          @failover&.close # in the child: closes its copies of the sockets only
        rescue StandardError
          nil
        end

        private

        def push(op)
          @mu.synchronize do
            @ops << op
            @cv.broadcast
          end
        end

        def run
          retry_in = RETRY_MIN
          loop do
            failover = current_failover
            break if @stopping || failover.equal?(NullFailover)
            unless failover
              wait_ops(retry_in)
              retry_in = [retry_in * 2, RETRY_MAX].min
              next
            end
            retry_in = RETRY_MIN
            op = @mu.synchronize do
              @cv.wait(@mu, 1) if @ops.empty?
              @ops.shift
            end
            unless op # once a second: is the Failover still alive? a refused hub back?
              retry_hub
              next
            end

            case op[0]
            when :listen
              begin
                failover.subscribe(op[1])
                failover = verify_database(failover, op[1])
                @event_loop.post(&op[2]) if op[2]
              rescue ::Listenhub::InvalidNameError, ::Listenhub::LimitError => e
                @logger.error("listenhub adapter: #{e.message}")
              rescue ::Listenhub::Error => e
                @logger.error("listenhub adapter: subscribe to #{op[1].inspect} failed: #{e.message}; retrying")
                @mu.synchronize { @ops.unshift(op) }
                wait_ops(RETRY_MIN)
              end
            when :unlisten
              failover.unsubscribe(op[1])
            when :shutdown
              break
            end
          end
        rescue StandardError => e
          @logger.error("listenhub adapter: listener thread crashed: #{e.class}: #{e.message}")
        end

        def wait_ops(seconds)
          @mu.synchronize do
            return if @ops.any? { |op| op[0] == :shutdown }

            @cv.wait(@mu, seconds)
          end
        end

        # The Failover, made when there is none or it died (hub and
        # database both unreachable). A new one after a dead one subscribes
        # again every channel that has subscribers (queued first). nil while
        # it cannot be made.
        def current_failover
          return @failover if @failover && @failover.err.nil?
          return NullFailover if @stopping

          again = !@failover.nil?
          @failover&.close
          @failover = nil
          @failover = @adapter.new_failover(
            on_wake: ->(w) { on_wake(w) },
            on_status: ->(h) { on_status(h) }
          )
          if again
            channels = @sync.synchronize { @subscribers.keys }
            @mu.synchronize { @ops.unshift(*channels.map { |ch| [:listen, ch, nil] }) }
          end
          @failover
        rescue StandardError => e
          @logger.error("listenhub adapter: no listener (#{e.message}); retrying")
          nil
        end

        PROBE_TIMEOUT = 5.0

        # A hub that LISTENs on another database than the app's acks every
        # subscribe and delivers nothing the app broadcasts. So the first
        # time a Failover is on the hub, a probe goes round: subscribe a
        # private name through the hub (acked: its LISTEN is active), NOTIFY
        # it through Active Record's connection, and wait for it to come
        # back through the hub. When it does not within PROBE_TIMEOUT, the
        # hub is not trusted: an error line naming the socket and the
        # app's database, and the process listens on a connection of its
        # own (made here; subscriptions are made again on it). Returns the
        # listener to go on with.
        def verify_database(failover, just_subscribed)
          return failover if @verified.equal?(failover) || !failover.respond_to?(:mode) || failover.mode != :hub

          return (@verified = failover) if probe_hub(failover)

          @logger.error("listenhub adapter: the hub at #{@adapter.socket} does not deliver what this app " \
                        "broadcasts on #{@adapter.database_description} (a probe NOTIFY did not come back " \
                        "within #{PROBE_TIMEOUT.to_i}s): it serves another database; not using it, listening " \
                        "on a connection of this process (run the hub with this app's database URL)")
          failover.close
          local = @adapter.new_local(on_wake: ->(w) { on_wake(w) }, on_status: ->(h) { on_status(h) })
          @verified = local
          @failover = local
          @hub_refused_at = ::Listenhub.monotonic
          channels = @sync.synchronize { @subscribers.keys }
          channels.each { |ch| local.subscribe(ch) }
          local.subscribe(just_subscribed) unless channels.include?(just_subscribed)
          local
        end

        # Whether the probe came back through failover's hub (or failover
        # is not on a hub, where its own connection is right).
        def probe_hub(failover)
          name = "listenhub.probe.#{Process.pid}.#{SecureRandom.hex(4)}"
          token = SecureRandom.hex(8)
          @probe_mu.synchronize { @probe = [name, token, false] }
          begin
            failover.subscribe(name)
            return true if failover.mode != :hub # failed over meanwhile: local is right

            deadline = ::Listenhub.monotonic + PROBE_TIMEOUT
            came = false
            until came || ::Listenhub.monotonic > deadline
              @adapter.with_broadcast_connection do |pg_conn|
                pg_conn.exec("NOTIFY #{pg_conn.escape_identifier(@adapter.pg_channel(name))}, '#{token}'")
              end
              resend_at = [::Listenhub.monotonic + 0.5, deadline].min
              until came || ::Listenhub.monotonic > resend_at
                sleep 0.02
                came = @probe_mu.synchronize { @probe[2] }
              end
            end
            failover.unsubscribe(name)
            came || failover.mode != :hub
          ensure
            @probe_mu.synchronize { @probe = nil }
          end
        end

        # After a hub was refused (another database), it is tried again
        # every hub_recheck_interval: a hub restarted with the app's URL is
        # used again once the probe comes back through it. Every channel is
        # subscribed there before the process's own connection is closed
        # (a message in the overlap may come twice, none is lost).
        def retry_hub
          return unless @hub_refused_at && ::Listenhub.monotonic - @hub_refused_at >= @adapter.hub_recheck_interval

          @hub_refused_at = ::Listenhub.monotonic
          cand = @adapter.new_failover(on_wake: ->(w) { on_wake(w) }, on_status: ->(h) { on_status(h) })
          unless cand.mode == :hub && probe_hub(cand)
            cand.close
            return
          end
          @sync.synchronize { @subscribers.keys }.each { |ch| cand.subscribe(ch) }
          old = @failover
          @failover = cand
          @verified = cand
          @hub_refused_at = nil
          old&.close
          @logger.info("listenhub adapter: the hub at #{@adapter.socket} now delivers what this app broadcasts; " \
                       "back on it, the process's own connection closed")
        rescue StandardError => e
          cand&.close
          @logger.debug("listenhub adapter: the hub is still not usable: #{e.message}")
        end

        # The hub repeats its status every few seconds: log changes only.
        def on_status(healthy)
          return if healthy == @healthy

          @healthy = healthy
          if healthy
            @logger.info("listenhub adapter: Postgres healthy")
          else
            @logger.warn("listenhub adapter: Postgres not healthy (subscriptions are kept; messages sent meanwhile may be lost)")
          end
        end

        # A durable wake (empty payload) carries no message: it is what the
        # hub and the failover send after a gap ("re-read"), which Action
        # Cable has no use for. An empty broadcast is therefore not
        # delivered (the postgresql adapter delivers "").
        def on_wake(w)
          probe = @probe_mu.synchronize { @probe }
          if probe && w.name == probe[0]
            @probe_mu.synchronize { @probe[2] = true if @probe && w.payload == probe[1] }
            return
          end
          return if w.durable?

          broadcast(w.name, w.payload)
        end

        # Stands for "no Failover, and shutting down".
        NullFailover = Object.new.freeze
      end
    end
  end
end
