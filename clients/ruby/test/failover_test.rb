# frozen_string_literal: true

# Failover against a real hub and a real Postgres: the hub is killed, the
# client goes on with its own LISTEN connection, and returns to the hub.
require_relative "test_helper"
require "open3"
require "rbconfig"
require "socket"
require "uri"

class FailoverTest < LHTestCase
  PREFIX = "lh."
  SUFFIX = ".ev"
  # Needs quoting (a dot, a capital, a double quote): the local LISTEN must
  # send it as a quoted identifier with the quote doubled.
  ODD = 'Mixed"Case.q'

  def setup
    super
    @col = Collector.new
  end

  def hub(**opts)
    super(prefix: PREFIX, suffix: SUFFIX, **opts)
  end

  def failover(path, **opts)
    @app = "lhrb-local-#{name}"[0, 60]
    f = Listenhub::Failover.new(path, database_url: DATABASE_URL, channel_prefix: PREFIX, channel_suffix: SUFFIX,
                                      application_name: @app, on_wake: @col.on_wake, on_status: @col.on_status, **opts)
    cleanup { f.close }
    f
  end

  def notify(q, payload = "")
    db.notify(PREFIX + q + SUFFIX, payload)
  end

  def durable(q)
    Listenhub::Wake.new(q, nil)
  end

  def test_hub_killed_fails_over_to_local_listen
    h = hub
    reasons = []
    f = failover(h.socket, on_failover: ->(r) { reasons << r }, min_local: 60)
    f.subscribe("jobs")
    f.subscribe(ODD)
    assert_equal :hub, f.mode
    assert_equal 0, db.backends(@app)
    notify("jobs", "via-hub")
    @col.wait("a wake through the hub") { |s| s.payloads("jobs").include?("via-hub") }

    h.kill
    LHTest.wait_for("local mode") { f.mode == :local }
    @col.wait("a durable wake per name") { |s| s.include?(durable("jobs")) && s.include?(durable(ODD)) }
    assert_equal 1, @col.count(durable("jobs"))
    assert_equal 1, reasons.size
    assert_kind_of Listenhub::ConnError, reasons[0]
    assert_equal 1, db.backends(@app)
    assert f.healthy?

    notify("jobs", "via-local")
    notify(ODD, "odd")
    @col.wait("wakes through the local listener") { |s| s.payloads("jobs").include?("via-local") && s.payloads(ODD).include?("odd") }
    f.subscribe("later")
    f.unsubscribe("jobs")
    f.subscribe("sync-point") # LISTEN/UNLISTEN run in call order
    notify("jobs", "gone")
    notify("later", "new")
    @col.wait("a wake for a name subscribed in local mode") { |s| s.payloads("later").include?("new") }
    refute_includes @col.payloads("jobs"), "gone"
    assert_equal [ODD, "later", "sync-point"].sort, f.subscriptions.sort

    f.close
    LHTest.wait_for("the local backend gone") { db.backends(@app).zero? }
  end

  # SIGKILL, fallback, fail-back while a writer commits back to back. The
  # durable rule: a reader that re-reads on every durable wake ends having
  # seen the last committed state (every wake lost in the gap is made up by
  # the failover's and the fail-back's own durable wakes). The ephemeral
  # rule: every payload committed once the local listener took over arrives,
  # across the fail-back (make before break).
  def test_sigkill_fallback_failback_loses_no_durable_wake
    db.conn.exec("CREATE TABLE IF NOT EXISTS lhrb_counter (id int PRIMARY KEY, n bigint NOT NULL)")
    db.conn.exec("INSERT INTO lhrb_counter VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET n = 0")
    h = hub
    wakes = Queue.new
    on_wake = lambda do |w|
      @col.on_wake.call(w)
      wakes << true if w.name == "counter" && w.durable?
    end
    @app = "lhrb-local-#{name}"[0, 60]
    f = Listenhub::Failover.new(h.socket, database_url: DATABASE_URL, channel_prefix: PREFIX, channel_suffix: SUFFIX,
                                          application_name: @app, on_wake: on_wake, min_local: 0.2, probe_interval: 0.1)
    cleanup { f.close }
    f.subscribe("counter")
    f.subscribe("stream")
    seen = 0
    reader = Thread.new do
      d = DB.new
      while wakes.pop
        seen = d.conn.exec("SELECT n FROM lhrb_counter WHERE id = 1").getvalue(0, 0).to_i
      end
    ensure
      d&.close
    end
    sent = []
    mu = Mutex.new
    stop = false
    committed = 0
    pump = Thread.new do
      d = DB.new
      i = 0
      until stop
        i += 1
        d.conn.transaction do |c|
          c.exec("UPDATE lhrb_counter SET n = n + 1 WHERE id = 1")
          c.exec("NOTIFY #{c.escape_identifier(PREFIX + 'counter' + SUFFIX)}")
        end
        d.notify(PREFIX + "stream" + SUFFIX, i.to_s)
        mu.synchronize do
          committed = i
          sent << i.to_s
        end
      end
    ensure
      d&.close
    end
    begin
      LHTest.wait_for("NOTIFYs before the kill") { mu.synchronize { sent.size > 100 } }
      h.kill
      LHTest.wait_for("local mode") { f.mode == :local }
      floor = mu.synchronize { sent.size }
      LHTest.wait_for("NOTIFYs in local mode") { mu.synchronize { sent.size > floor + 100 } }
      assert_equal 1, db.backends(@app)
      h2 = Hub.new("#{name}-2", prefix: PREFIX, suffix: SUFFIX, socket: h.socket, dir: h.dir)
      cleanup { h2.close }
      LHTest.wait_for("back on the hub") { f.mode == :hub }
      n = mu.synchronize { sent.size }
      LHTest.wait_for("NOTIFYs after the fail-back") { mu.synchronize { sent.size > n + 100 } }
    ensure
      stop = true
      pump.join
    end
    LHTest.wait_for("the reader to see the last committed state (#{committed})") { seen == committed }
    wakes << nil
    reader.join
    # floor was read once the local listener was current; floor+1 may have
    # been in flight then.
    want = mu.synchronize { sent[(floor + 1)..] }
    @col.wait("every payload committed since the local listener took over") { |s| (want - s.payloads("stream")).empty? }
    assert_operator want.size, :>, 200
    LHTest.wait_for("the local backend gone") { db.backends(@app).zero? }
  end

  def test_eviction_fails_over
    h = hub(args: ["--hard-queue-limit", "16"])
    release = Queue.new
    first = Queue.new
    @app = "lhrb-local-#{name}"[0, 60]
    seen = false
    on_wake = lambda do |w|
      @col.on_wake.call(w)
      unless seen
        seen = true
        first << true
        release.pop # stop reading: the hub's queue for us grows
      end
    end
    f = Listenhub::Failover.new(h.socket, database_url: DATABASE_URL, channel_prefix: PREFIX, channel_suffix: SUFFIX,
                                          application_name: @app, on_wake: on_wake, min_local: 60)
    cleanup do
      release << true
      f.close
    end
    f.subscribe("flood")
    db.conn.exec_params("SELECT pg_notify($1, i::text) FROM generate_series(1, 50000) i", [PREFIX + "flood" + SUFFIX])
    first.pop
    LHTest.wait_for("the eviction in the hub's log") { h.output.include?("worker evicted") }
    release << true
    LHTest.wait_for("local mode") { f.mode == :local }
    assert_kind_of Listenhub::ConnError, f.reason
    @col.wait("the durable wake of the failover") { |s| s.include?(durable("flood")) }
  end

  def test_no_hub_at_start_is_local_mode_at_once
    f = failover(File.join(tmpdir, "none.sock"), min_local: 60)
    assert_equal :local, f.mode
    f.subscribe("x")
    notify("x", "local")
    @col.wait("a local wake") { |s| s.payloads("x") == ["local"] }
  end

  def test_ack_timeout_fails_over
    fake = FakeHub.new(:silent)
    cleanup { fake.close }
    f = failover(fake.socket, ack_timeout: 0.3, min_local: 60)
    f.subscribe("x")
    assert_equal :local, f.mode
    assert_kind_of Listenhub::AckTimeoutError, f.reason
  end

  # close from inside a callback returns (on the hub's reader thread, and
  # on the local listener's) and no callback runs after it.
  def test_close_from_a_callback
    [:hub, :local].each do |mode|
      h = hub
      path = mode == :hub ? h.socket : File.join(tmpdir, "none.sock")
      f = nil
      after = []
      closed = Queue.new
      on_wake = lambda do |w|
        if f.err
          after << w
        else
          f.close
          closed << true
        end
      end
      f = Listenhub::Failover.new(path, database_url: DATABASE_URL, channel_prefix: PREFIX, channel_suffix: SUFFIX,
                                        on_wake: on_wake, min_local: 60)
      cleanup { f.close }
      assert_equal mode, f.mode
      f.subscribe("cb")
      notify("cb", "1")
      Timeout.timeout(LHTest::TIMEOUT) { closed.pop }
      notify("cb", "2")
      sleep 0.2
      assert_empty after, "a callback after close (#{mode})"
      assert_kind_of Listenhub::ClosedError, f.err
    end
  end

  def test_invalid_name_does_not_fail_over
    h = hub
    f = failover(h.socket)
    assert_raises(Listenhub::InvalidNameError) { f.subscribe("x" * 60) } # 66 bytes mapped: the hub's nack
    assert_equal :hub, f.mode
    assert_empty f.subscriptions
  end

  # Fail-back is exact: numbered NOTIFYs at 500 a second flow through 20
  # fail-backs (the hub killed while the sender pauses, so that the
  # failover's own gap is not counted; restarted while it sends), and each
  # one arrives once, in commit order.
  # A hub on another database on the socket: every fail-back attempt's
  # marker passes the local listener and never the hub, and the local
  # wakes held after the marker are delivered when the attempt is given
  # up. Numbered NOTIFYs through 10 refused attempts (one hub connection
  # each, beside the test's readiness probes): every one arrives once, in
  # commit order.
  def test_refused_failbacks_lose_nothing
    other = "lhrb_refused_#{Process.pid}"
    admin = PG.connect(DATABASE_URL)
    admin.exec("SET client_min_messages = warning")
    admin.exec("DROP DATABASE IF EXISTS #{other}")
    admin.exec("CREATE DATABASE #{other}")
    dir = tmpdir
    sock = File.join(dir, "hub.sock")
    f = failover(sock, min_local: 0.05, probe_interval: 0.05, probe_max_interval: 0.1, ack_timeout: 0.5)
    f.subscribe("seq")
    assert_equal :local, f.mode
    sent = 0
    stop = false
    sender = Thread.new do
      conn = PG.connect(DATABASE_URL)
      until stop
        sent += 1
        conn.exec_params("SELECT pg_notify($1, $2)", [PREFIX + "seq" + SUFFIX, "n#{sent}"])
        sleep 0.003
      end
      conn.close
    end
    url = DATABASE_URL.sub(%r{/postgres(\?|\z)}, "/#{other}\\1")
    refute_equal DATABASE_URL, url, "the other database's URL"
    h = nil
    begin
      h = Hub.new(name, prefix: PREFIX, suffix: SUFFIX, socket: sock, dir: dir, args: ["--database-url", url])
      attempts = -> { h.output.scan("worker connected").size }
      LHTest.wait_for("10 refused fail-back attempts", 3 * TIMEOUT) { attempts.() >= 13 }
    ensure
      stop = true
      sender.join
      h&.close
      admin.exec("DROP DATABASE IF EXISTS #{other} WITH (FORCE)")
      admin.close
    end
    seqs = ->(s) { s.payloads("seq").grep(/\An\d+\z/).map { |p| p[1..].to_i } }
    @col.wait("the last NOTIFY") { |s| seqs.(s).max.to_i >= sent }
    assert_equal :local, f.mode
    got = seqs.(@col)
    lost = (1..sent).to_a - got
    dups = got.tally.select { |_, c| c > 1 }.keys
    assert_empty lost, "lost through refused fail-backs"
    assert_empty dups, "delivered twice through refused fail-backs"
    assert_equal got.sort, got, "out of commit order"
  end

  # The hub up, its Postgres not (a port where nothing listens yet): the
  # Failover stays on the hub, is told healthy false, and its subscribe
  # waits past its ack timeout and the hub's old 5 s command timeout,
  # instead of failing over to a local listener that cannot connect
  # either. Once Postgres is up the sub is acked and a NOTIFY arrives.
  def test_postgres_down_at_start_worker_stays
    port, up = later_proxy
    down = via(DATABASE_URL, port)
    h = hub(args: ["--database-url", down], ready: false)
    f = failover(h.socket, database_url: down, ack_timeout: 1.0)
    assert_equal :hub, f.mode
    result = nil
    sub = Thread.new do
      f.subscribe("a")
      result = :ok
    rescue StandardError => e
      result = e
    end
    refute sub.join(7), "subscribe returned #{result.inspect} while Postgres is down" # seven ack timeouts
    assert_equal :hub, f.mode
    assert_includes @col.statuses, false
    refute_includes @col.statuses, true
    up.()
    assert sub.join(TIMEOUT), "no ack once Postgres is up"
    assert_equal :ok, result
    notify("a", "after")
    @col.wait("the wake through the hub") { |s| s.wakes.include?(Listenhub::Wake.new("a", "after")) }
    assert_equal :hub, f.mode
  end

  # A database beside the test's, dropped at the end; its URL.
  def other_database(name)
    admin = PG.connect(DATABASE_URL)
    admin.exec("SET client_min_messages = warning")
    admin.exec("DROP DATABASE IF EXISTS #{name}")
    admin.exec("CREATE DATABASE #{name}")
    cleanup do
      admin.exec("DROP DATABASE IF EXISTS #{name} WITH (FORCE)")
      admin.close
    end
    u = URI(DATABASE_URL)
    u.path = "/#{name}"
    u.to_s
  end

  # A port where nothing listens yet (Postgres down); the returned lambda
  # starts forwarding it to the test's server.
  def later_proxy
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    real = URI(DATABASE_URL)
    up = lambda do
      srv = TCPServer.new("127.0.0.1", port)
      pipes = []
      acceptor = Thread.new do
        loop do
          c = srv.accept
          s = TCPSocket.new(real.host, real.port || 5432)
          pipes << c << s
          [[c, s], [s, c]].each do |a, b|
            Thread.new do
              IO.copy_stream(a, b)
            rescue IOError, SystemCallError
              nil
            ensure
              [a, b].each { |x| x.close rescue nil } # rubocop:disable Style/RescueModifier
            end
          end
        end
      rescue IOError, SystemCallError
        nil
      end
      cleanup do
        srv.close
        acceptor.join
        pipes.each { |x| x.close rescue nil } # rubocop:disable Style/RescueModifier
      end
    end
    [port, up]
  end

  def via(url, port)
    u = URI(url)
    u.host = "127.0.0.1"
    u.port = port
    u.to_s
  end

  # A hub serving another database acks every subscribe and delivers none
  # of this one's NOTIFYs: the Failover finds out at start (a NOTIFY of a
  # private name that does not come back through the hub), says so at
  # ERROR, and listens on its own connection.
  def test_hub_on_another_database_is_refused_at_start
    url = other_database("lhrb_other_#{Process.pid}")
    h = hub(args: ["--database-url", url])
    f = failover(h.socket)
    assert_equal :local, f.mode
    assert_kind_of Listenhub::OtherDatabaseError, f.reason
    f.subscribe("jobs")
    notify("jobs", "through-our-own")
    @col.wait("the wake through the local listener") { |s| s.wakes.include?(Listenhub::Wake.new("jobs", "through-our-own")) }
  end

  # A hub on another database whose Postgres is down when the Failover
  # starts cannot be checked then, and is not trusted either: its wakes
  # wait until it says healthy and the check runs, which finds the other
  # database; the Failover listens on its own connection and delivers this
  # database's NOTIFYs, none of the other's.
  def test_unverified_hub_on_another_database_refused_once_up
    url = other_database("lhrb_unverified_#{Process.pid}")
    port, up = later_proxy
    h = hub(args: ["--database-url", via(url, port)], ready: false)
    f = failover(h.socket, ack_timeout: 1.0)
    assert_equal :hub, f.mode
    sub = Thread.new { f.subscribe("a") }
    up.()
    LHTest.wait_for("local mode once the check ran") { f.mode == :local }
    assert_kind_of Listenhub::OtherDatabaseError, f.reason
    sub.join(TIMEOUT)
    oc = PG.connect(url)
    oc.exec_params("SELECT pg_notify($1, 'foreign')", [PREFIX + "a" + SUFFIX])
    oc.close
    notify("a", "ours")
    @col.wait("our NOTIFY") { |s| s.wakes.include?(Listenhub::Wake.new("a", "ours")) }
    refute_includes @col.wakes, Listenhub::Wake.new("a", "foreign")
  end

  # A frozen hub (SIGSTOPped: its socket open, nothing read or written) is
  # a dead hub: no frame for silence_timeout, though it re-sends its status
  # every 5 status intervals (1 s here), and the Failover listens on its
  # own connection; a NOTIFY committed during the freeze arrives through it.
  def test_frozen_hub_fails_over
    h = hub
    f = failover(h.socket, silence_timeout: 3.0)
    f.subscribe("a")
    assert_equal :hub, f.mode
    Process.kill("STOP", h.pid)
    cleanup { Process.kill("CONT", h.pid) rescue nil } # rubocop:disable Style/RescueModifier
    LHTest.wait_for("local mode after the hub froze") { f.mode == :local }
    assert_match(/no frame from the hub/, f.reason.message)
    notify("a", "during the freeze")
    @col.wait("the wake through the local listener") { |s| s.wakes.include?(Listenhub::Wake.new("a", "during the freeze")) }
  end

  # A program that set no logger still hears why a Failover listens on a
  # connection of its own: the gem's default logger writes warnings to
  # stderr.
  def test_fallback_is_said_without_a_logger
    path = File.join(tmpdir, "absent.sock")
    code = "require 'listenhub'; f = Listenhub::Failover.new(#{path.inspect}, database_url: #{DATABASE_URL.inspect}); " \
           "exit(f.mode == :local ? 0 : 3)"
    lib = File.expand_path("../lib", __dir__)
    out, err, st = Open3.capture3(RbConfig.ruby, "-I", lib, "-e", code)
    assert st.success?, "#{out}#{err}"
    assert_match(/hub unreachable/, err)
    assert_includes err, path
  end

  def test_failback_exact_through_20
    h = hub
    backs = Queue.new
    f = failover(h.socket, min_local: 0.1, probe_interval: 0.05, probe_max_interval: 0.2,
                           on_failback: -> { backs << true })
    f.subscribe("seq")
    sent = 0
    paused = true
    mu = Mutex.new
    stop = false
    sender = Thread.new do
      conn = PG.connect(DATABASE_URL)
      until stop
        mu.synchronize do
          next if paused

          sent += 1
          conn.exec_params("SELECT pg_notify($1, $2)", [PREFIX + "seq" + SUFFIX, "n#{sent}"])
        end
        sleep 0.002
      end
      conn.close
    end
    seqs = lambda do |s|
      s.payloads("seq").grep(/\An\d+\z/).map { |p| p[1..].to_i }
    end
    upto = ->(n) { @col.wait("seq #{n}") { |s| seqs.(s).max.to_i >= n } }
    mu.synchronize { paused = false }
    upto.(10)
    20.times do |i|
      at = mu.synchronize { paused = true; sent }
      upto.(at)
      h.kill
      LHTest.wait_for("local mode") { f.mode == :local }
      mu.synchronize { paused = false }
      upto.(at + 10)
      h.start
      Timeout.timeout(TIMEOUT) { backs.pop }
      assert_equal :hub, f.mode, "fail-back #{i + 1}"
      upto.(mu.synchronize { sent } + 10)
    end
    stop = true
    sender.join
    upto.(sent)
    got = seqs.(@col)
    dups = got.tally.select { |_, c| c > 1 }.keys
    lost = (1..sent).to_a - got
    assert_empty dups, "delivered twice through 20 fail-backs"
    assert_empty lost, "lost through 20 fail-backs"
    assert_equal got.sort, got, "out of commit order"
  end
end

# The local listener proves that notifications arrive on its connection: a
# transaction-pooling PgBouncer accepts LISTEN and delivers nothing.
class DeliveryCheckTest < LHTestCase
  def pooler(mode)
    url = ENV.fetch("LHTEST_PGBOUNCER_#{mode.upcase}_URL", "")
    if url.empty?
      flunk("no PgBouncer (CI=true: the delivery check must be tested)") if ENV["CI"] == "true"
      skip "no PgBouncer (LHTEST_PGBOUNCER_#{mode.upcase}_URL)"
    end
    url
  end

  def test_direct_connection_passes
    l = Listenhub::Local.new(database_url: DATABASE_URL)
    l.subscribe("x")
    l.close
  end

  def test_transaction_pooler_is_refused
    err = assert_raises(Listenhub::Error) { Listenhub::Local.new(database_url: pooler("transaction")) }
    assert_match(/transaction-pooling PgBouncer/, err.message)
  end

  def test_session_pooler_delivers
    col = Collector.new
    l = Listenhub::Local.new(database_url: pooler("session"), on_wake: col.on_wake)
    cleanup { l.close }
    l.subscribe("via_session_pool")
    db.notify("via_session_pool", "ok")
    col.wait("the wake through the session pool") { |s| s.payloads("via_session_pool") == ["ok"] }
  end

end
