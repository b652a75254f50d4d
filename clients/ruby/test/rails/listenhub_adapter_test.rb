# frozen_string_literal: true

# Rails' own subscription adapter contract (common.rb, channel_prefix.rb)
# against `adapter: listenhub` with a real hub and a real Postgres, as
# Rails runs it against `adapter: postgresql`; then what the listenhub
# adapter adds: the ack before success, the mapping through the hub's
# prefix and suffix, interplay with the postgresql adapter, the fallback,
# fork.
require "test_helper"
require_relative "subscription_adapter/common"
require_relative "subscription_adapter/channel_prefix"

class ListenhubAdapterTest < ActionCable::TestCase
  include CommonSubscriptionAdapterTest
  include ChannelPrefixTest

  def setup
    @extra = []
    LHTest.require_env(self)
    LHRails.establish
    super
  end

  def teardown
    super
    @extra.reverse_each(&:call)
    ActiveRecord::Base.clear_all_connections!
  end

  def cable_config
    { adapter: "listenhub", socket: LHRails.hub.socket }
  end

  def adapter_for(config, log = nil)
    server = ActionCable::Server::Base.new(config: ActionCable::Server::Configuration.new)
    server.config.cable = config.with_indifferent_access
    server.config.logger = Logger.new(log || StringIO.new).tap { |l| l.level = log ? Logger::WARN : Logger::UNKNOWN }
    adapter = server.config.pubsub_adapter.new(server)
    @extra << -> { adapter.shutdown }
    adapter
  end

  def census(app)
    ActiveRecord::Base.connection.select_value(
      "SELECT count(*) FROM pg_stat_activity WHERE application_name = #{ActiveRecord::Base.connection.quote(app)}"
    ).to_i
  end

  def test_adapter_is_found_by_name
    assert_equal ActionCable::SubscriptionAdapter::Listenhub, @rx_adapter.class
  end

  # Through the hub: no backend of this process LISTENs.
  def test_subscriptions_go_through_the_hub
    subscribe_as_queue("via hub") do |queue|
      @tx_adapter.broadcast("via hub", "hello")
      assert_equal "hello", queue.pop
      assert_equal 0, census("listenhub-local")
      assert_equal 1, census(LHRails.hub.app)
    end
  end

  # success_callback runs once the hub acked, not before: a hub that never
  # acks never gets it called.
  def test_success_callback_waits_for_the_ack
    fake = LHTest::FakeHub.new(:silent)
    @extra << -> { fake.close }
    adapter = adapter_for(adapter: "listenhub", socket: fake.socket, ack_timeout: 60)
    called = Concurrent::Event.new
    adapter.subscribe("never acked", ->(_) {}, -> { called.set })
    assert_equal "never acked", fake.subs.pop
    refute called.wait(0.5), "success_callback ran without an ack"
  end

  # The same payload limit and the same error as the postgresql adapter
  # (Postgres's own: NOTIFY refuses 8000 bytes and more).
  def test_payload_limit_is_postgresql_adapters
    pg = adapter_for(adapter: "postgresql")
    limit = ->(a) { assert_raises(ActiveRecord::StatementInvalid, PG::Error) { a.broadcast("big", "x" * 8000) } }
    ours = limit.call(@tx_adapter)
    theirs = limit.call(pg)
    assert_equal theirs.class, ours.class
    assert_match(/payload string too long/, ours.message)
    subscribe_as_queue("big") do |queue|
      @tx_adapter.broadcast("big", "y" * 7999)
      assert_equal "y" * 7999, queue.pop
    end
  end

  # Either adapter's broadcast reaches the other's subscribers: the same
  # channel identifier (with Action Cable's channel_prefix and the SHA1 of
  # a long name), so processes can move from one to the other one by one.
  def test_interoperates_with_the_postgresql_adapter
    cfg = { channel_prefix: "app" }
    ours = adapter_for(cable_config.merge(cfg))
    pg = adapter_for({ adapter: "postgresql" }.merge(cfg))
    long = "b" * 100
    [["short", ours, pg], ["short", pg, ours], [long, ours, pg], [long, pg, ours]].each do |channel, rx, tx|
      subscribe_as_queue(channel, rx) do |queue|
        tx.broadcast(channel, "from #{tx.class.name.demodulize}")
        assert_equal "from #{tx.class.name.demodulize}", queue.pop
      end
    end
  end

  # Action Cable's channel_prefix, the 63-byte SHA1 rule and the hub's own
  # --channel-prefix/--channel-suffix compose: the broadcast NOTIFYs
  # exactly the channel the hub LISTENs for the subscription.
  def test_mapping_composes_with_the_hubs_prefix_and_suffix
    hp = "lh_app."
    hs = ".cable"
    h = LHTest::Hub.new("rails-mapped", prefix: hp, suffix: hs)
    @extra << -> { h.close }
    cfg = { adapter: "listenhub", socket: h.socket, channel_prefix: "foo", hub_channel_prefix: hp, hub_channel_suffix: hs }
    rx = adapter_for(cfg)
    tx = adapter_for(cfg)
    other = adapter_for(cfg.merge(channel_prefix: "bar"))
    fits = "c" * 50 # "foo:" + 50 = 54 characters (kept by Rails' rule); 67 bytes with the hub's mapping: hashed
    multibyte = "é" * 30 # 34 characters, 64 bytes: hashed even without a mapping
    ["chat", fits, multibyte, "d" * 100].each do |channel|
      subscribe_as_queue(channel, rx) do |queue|
        subscribe_as_queue(channel, other) do |other_queue|
          tx.broadcast(channel, "to #{channel[0, 5]}")
          assert_equal "to #{channel[0, 5]}", queue.pop
          assert_empty other_queue, "another channel_prefix got it"
        end
      end
      mapped = rx.pg_channel("foo:#{channel}")
      assert_operator mapped.bytesize, :<=, 63
      assert mapped.start_with?(hp) && mapped.end_with?(hs), mapped
    end
    assert_equal "#{hp}foo:chat#{hs}", rx.pg_channel("foo:chat")
    assert_equal "#{hp}#{Digest::SHA1.hexdigest("foo:#{fits}")}#{hs}", rx.pg_channel("foo:#{fits}")
    assert_raises(ArgumentError) { adapter_for(cfg.merge(hub_channel_prefix: "p" * 20)) }
  end

  # A hub on another database than the app's acks every subscribe and
  # delivers nothing the app broadcasts. The adapter's probe notices it
  # (before the success callback), an error line names the socket and the
  # app's database, and the process listens on a connection of its own:
  # the broadcast arrives.
  def test_hub_on_another_database_is_not_trusted
    other = "lhrb_other_#{Process.pid}"
    ActiveRecord::Base.connection.execute("CREATE DATABASE #{other}")
    @extra << -> { ActiveRecord::Base.connection.execute("DROP DATABASE IF EXISTS #{other} WITH (FORCE)") }
    kv = PG::Connection.conninfo_parse(LHTest::DATABASE_URL).each_with_object({}) { |o, h| h[o[:keyword]] = o[:val] if o[:val] }
    url = kv.merge("dbname" => other).map { |k, v| "#{k}=#{PG::Connection.quote_connstr(v)}" }.join(" ")
    h = LHTest::Hub.new("rails-otherdb", args: ["--database-url", url])
    @extra << -> { h.close }
    log = StringIO.new
    app = "lhrb-cable-otherdb"
    adapter = adapter_for({ adapter: "listenhub", socket: h.socket, id: app }, log)
    queue = Queue.new
    subscribed = Concurrent::Event.new
    adapter.subscribe("otherdb", ->(m) { queue << m }, -> { subscribed.set })
    assert subscribed.wait(20), "no success callback"
    assert_equal 1, census(app), "not listening on a connection of its own"
    @tx_adapter.broadcast("otherdb", "arrives")
    Timeout.timeout(10) { assert_equal "arrives", queue.pop }
    db = ActiveRecord::Base.connection_db_config.configuration_hash[:database]
    assert_includes log.string, "the hub at #{h.socket} does not deliver what this app broadcasts on #{db}"
    adapter.shutdown
  end

  # A hub refused for serving another database is tried again: once one on
  # the app's database serves the socket, the adapter returns to it (its
  # own LISTEN connection closed) and broadcasts arrive through the hub.
  def test_returns_to_the_hub_once_it_hears_the_database
    other = "lhrb_back_#{Process.pid}"
    ActiveRecord::Base.connection.execute("CREATE DATABASE #{other}")
    @extra << -> { ActiveRecord::Base.connection.execute("DROP DATABASE IF EXISTS #{other} WITH (FORCE)") }
    kv = PG::Connection.conninfo_parse(LHTest::DATABASE_URL).each_with_object({}) { |o, h| h[o[:keyword]] = o[:val] if o[:val] }
    url = kv.merge("dbname" => other).map { |k, v| "#{k}=#{PG::Connection.quote_connstr(v)}" }.join(" ")
    wrong = LHTest::Hub.new("rails-back-wrong", args: ["--database-url", url])
    @extra << -> { wrong.close }
    app = "lhrb-cable-back"
    adapter = adapter_for({ adapter: "listenhub", socket: wrong.socket, id: app, probe_max_interval: 1 })
    queue = Queue.new
    subscribed = Concurrent::Event.new
    adapter.subscribe("back", ->(m) { queue << m }, -> { subscribed.set })
    assert subscribed.wait(20), "no success callback"
    assert_equal 1, census(app), "not listening on a connection of its own"
    wrong.kill
    right = LHTest::Hub.new("rails-back-right", socket: wrong.socket, dir: wrong.dir)
    @extra << -> { right.close }
    LHTest.wait_for("back on the hub: no connection of its own") { census(app).zero? }
    @tx_adapter.broadcast("back", "through the hub")
    Timeout.timeout(10) do
      loop { break if queue.pop == "through the hub" }
    end
    adapter.shutdown
  end

  # Without a hub the adapter LISTENs on a connection of its own (taken out
  # of Active Record's pool), and returns to the hub once one is there.
  def test_no_hub_then_hub_fails_back
    dir = Dir.mktmpdir("lhrb-")
    @extra << -> { FileUtils.rm_rf(dir) }
    sock = File.join(dir, "hub.sock")
    app = "lhrb-cable-local"
    adapter = adapter_for(adapter: "listenhub", socket: sock, id: app, min_local: 0.2, probe_interval: 0.1)
    subscribe_as_queue("fallback", adapter) do |queue|
      @tx_adapter.broadcast("fallback", "local")
      assert_equal "local", queue.pop
      assert_equal 1, census(app)
      h = LHTest::Hub.new("rails-late", socket: sock, dir: dir)
      @extra << -> { h.close }
      LHTest.wait_for("the local backend gone after the fail-back") { census(app).zero? }
      @tx_adapter.broadcast("fallback", "hub")
      assert_equal "hub", queue.pop
    end
    adapter.shutdown # before the hub goes (a failover during teardown would hold a pooled connection)
  end

  # Action Cable calls the adapter from many threads: subscribes,
  # broadcasts and unsubscribes at once, every message delivered, and no
  # thread per subscription.
  def test_many_threads_and_no_thread_per_subscription
    adapter = adapter_for(cable_config)
    warm = Concurrent::Event.new
    adapter.subscribe("warm", ->(_) {}, -> { warm.set })
    assert warm.wait(10)
    threads_before = Thread.list.size
    n = 40
    queues = Array.new(n) { Queue.new }
    subscribed = Array.new(n) { Concurrent::Event.new }
    callbacks = Array.new(n) { |i| ->(m) { queues[i] << m } }
    Array.new(n) { |i| Thread.new { adapter.subscribe("t#{i % 10}", callbacks[i], -> { subscribed[i].set }) } }.each(&:join)
    subscribed.each { |e| assert e.wait(LHTest::TIMEOUT) }
    # Within a deadline: a thread of the moment (a subscriber's) may not
    # have ended yet; forty subscriptions would never get back under.
    LHTest.wait_for("threads back to at most #{threads_before + 2} (#{Thread.list.size}): threads grew with the subscriptions") do
      Thread.list.size <= threads_before + 2
    end
    Array.new(10) { |c| Thread.new { 5.times { |k| @tx_adapter.broadcast("t#{c}", "m#{k}") } } }.each(&:join)
    queues.each do |q|
      got = Array.new(5) { Timeout.timeout(LHTest::TIMEOUT) { q.pop } }
      assert_equal %w[m0 m1 m2 m3 m4], got.sort
    end
    Array.new(n) { |i| Thread.new { adapter.unsubscribe("t#{i % 10}", callbacks[i]) } }.each(&:join)
    @tx_adapter.broadcast("t0", "after")
    sleep CommonSubscriptionAdapterTest::WAIT_WHEN_NOT_EXPECTING_EVENT
    assert queues.all?(&:empty?), "a message after every unsubscribe"
  end

  # A listener made before fork (Puma's preload_app! master) is not used in
  # the child: the child gets its own, lazily; the parent's keeps working.
  def test_fork_reconnects_lazily_in_the_child
    subscribe_as_queue("before fork") do |queue|
      out = LHTest.in_child do
        LHRails.establish
        got = Queue.new
        ok = Concurrent::Event.new
        @rx_adapter.subscribe("in child", ->(m) { got << m }, -> { ok.set })
        ok.wait(10) or raise "no success callback in the child"
        @tx_adapter.broadcast("in child", "child hello")
        Timeout.timeout(10) { got.pop }
      end
      assert_equal "child hello", out
      @tx_adapter.broadcast("before fork", "parent still works")
      assert_equal "parent still works", queue.pop
    end
  end
end
