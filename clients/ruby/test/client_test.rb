# frozen_string_literal: true

# The hub client against a real hub and a real Postgres.
require_relative "test_helper"

class ClientTest < LHTestCase
  def connect(h, **opts)
    col = Collector.new
    c = Listenhub.connect(h.socket, on_wake: col.on_wake, on_status: col.on_status, **opts)
    cleanup { c.close }
    [c, col]
  end

  def test_subscribe_acks_then_wakes_with_payload_and_durable
    h = hub
    c, col = connect(h)
    assert_nil c.subscribe("jobs")
    db.notify("jobs", "hello")
    db.notify("jobs")
    col.wait("both wakes") { |s| s.wakes.include?(Listenhub::Wake.new("jobs", "hello")) && s.wakes.any?(&:durable?) }
    assert_equal ["jobs"], c.subscriptions
    col.wait("a healthy status") { |s| s.statuses.include?(true) }
    assert c.healthy?
  end

  # A name in a binary String (read from a socket or a file) whose bytes
  # are UTF-8 is the hub's name: its ack matches, the client lives, and
  # its wakes arrive, named in UTF-8.
  def test_binary_encoded_name_is_acked_and_woken
    h = hub
    c, col = connect(h)
    name = "caf\u00e9-\u00fc".b
    assert_equal Encoding::BINARY, name.encoding
    assert_nil c.subscribe(name)
    db.notify(name.dup.force_encoding(Encoding::UTF_8), "x")
    col.wait("the wake") { |s| s.wakes.any? { |w| w.payload == "x" } }
    w = col.wakes.find { |x| x.payload == "x" }
    assert_equal "caf\u00e9-\u00fc", w.name
    assert_nil c.err
    c.unsubscribe(name)
    assert_empty c.subscriptions
  end

  # 20,000 NOTIFYs in one transaction (River's InsertMany over 5,000 queues
  # sends as many): far past the hub's 1,024-frame limit, but a client that
  # reads is not evicted, as its own LISTEN would not have dropped them.
  def test_burst_in_one_transaction_reaches_a_reading_client_in_full
    n = 20_000
    h = hub
    c, col = connect(h)
    c.subscribe("burst")
    db.conn.exec_params("SELECT pg_notify('burst', 'q' || i) FROM generate_series(1, $1::int) i", [n])
    begin
      col.wait("the whole burst") { |s| s.wakes.size >= n }
    rescue Minitest::Assertion
      flunk "#{col.wakes.size} of #{n} wakes arrived; hub log:\n#{h.output[-3000..]}"
    end
    assert_equal (1..n).map { |i| "q#{i}" }, col.wakes.first(n).map(&:payload)
    db.notify("burst", "after")
    col.wait("the wake after the burst") { |s| s.wakes.size > n }
    assert_equal "after", col.wakes[n].payload
    refute_match(/worker evicted/, h.output)
  end

  # Without on_wake, wakes wait for wait_for_wake (the pg gem's
  # wait_for_notify style): a timeout is nil, a wake comes back whole, a
  # block gets it, and at death the wakes still queued come out first.
  def test_wait_for_wake_and_each
    h = hub
    c = Listenhub.connect(h.socket)
    cleanup { c.close }
    c.subscribe("pull")
    t0 = Listenhub.monotonic
    assert_nil c.wait_for_wake(0.2)
    assert_operator Listenhub.monotonic - t0, :>=, 0.2
    db.notify("pull", "one")
    assert_equal Listenhub::Wake.new("pull", "one"), c.wait_for_wake(10)
    db.notify("pull", "two")
    assert_equal "two", c.wait_for_wake(10) { |w| w.payload }
    db.notify("pull", "three")
    db.notify("pull")
    got = c.each.first(2)
    assert_equal [Listenhub::Wake.new("pull", "three"), Listenhub::Wake.new("pull", nil)], got
    db.notify("pull", "last")
    LHTest.wait_for("the last wake queued") { c.instance_variable_get(:@wakes).instance_variable_get(:@q).any? }
    c.close
    assert_equal [Listenhub::Wake.new("pull", "last")], c.each.to_a
    assert_nil c.wait_for_wake(0)
  end

  # A listener with on_wake has no queue to wait on.
  def test_wait_for_wake_with_on_wake_is_an_error
    c, = connect(hub)
    assert_raises(ArgumentError) { c.wait_for_wake(0) }
  end

  # The ack contract: once subscribe returned, every NOTIFY committed
  # afterwards arrives, while other sessions NOTIFY on the same channels
  # all along and several threads subscribe at once.
  def test_ack_contract_under_concurrent_notifies
    h = hub
    c, col = connect(h)
    names = (1..8).map { |i| "ack#{i}" }
    committed = Hash.new(0)
    mu = Mutex.new
    stop = false
    writers = names.each_slice(4).map do |slice|
      Thread.new do
        d = DB.new
        i = 0
        until stop
          i += 1
          slice.each { |q| d.notify(q, i.to_s) }
          mu.synchronize { slice.each { |q| committed[q] = i } }
        end
      ensure
        d&.close
      end
    end
    begin
      LHTest.wait_for("the writers running") { mu.synchronize { committed.size == names.size } }
      floor = {}
      names.map do |q|
        Thread.new do
          c.subscribe(q)
          mu.synchronize { floor[q] = committed[q] }
        end
      end.each(&:join)
      LHTest.wait_for("100 more NOTIFYs per name") { mu.synchronize { names.all? { |q| committed[q] > floor[q] + 100 } } }
    ensure
      stop = true
      writers.each(&:join)
    end
    names.each do |q|
      # floor[q] was read after the ack; floor+1 may have been in flight at
      # the ack, everything from floor+2 on began after it.
      want = ((floor[q] + 2)..committed[q]).map(&:to_s)
      col.wait("every NOTIFY after #{q}'s ack") { |s| (want - s.payloads(q)).empty? }
    end
  end

  def test_payload_fidelity
    h = hub
    c, col = connect(h)
    c.subscribe("fidelity")
    payloads = ["héllo wörld ✓ 日本語 🎉", %q(it's "quoted" \\ backslash 'single'), "x" * 7999,
                "{\"json\":[1,2,3],\"nested\":{\"a\":null}}", "tab\tnewline\nend"]
    payloads.each { |p| db.notify("fidelity", p) }
    db.notify("fidelity", "")
    col.wait("every payload") { |s| s.wakes.size >= payloads.size + 1 }
    got = col.wakes.map(&:payload)
    assert_equal payloads + [nil], got
    got.compact.each { |p| assert_equal Encoding::UTF_8, p.encoding }
    assert col.wakes.last.durable?, "an empty payload is a durable wake"
    # 8000 bytes is over Postgres's limit: the NOTIFY itself fails.
    err = assert_raises(PG::InvalidParameterValue) { db.notify("fidelity", "x" * 8000) }
    assert_match(/payload string too long/, err.message)
  end

  def test_refcounted_unsubscribe
    h = hub
    a, acol = connect(h)
    b, bcol = connect(h)
    a.subscribe("rc")
    a.subscribe("rc") # a set: no second subscription
    b.subscribe("rc")
    db.notify("rc", "1")
    acol.wait("a gets 1") { |s| s.payloads("rc") == ["1"] }
    bcol.wait("b gets 1") { |s| s.payloads("rc") == ["1"] }
    a.unsubscribe("rc") # the hub keeps LISTENing: b still subscribes
    assert_empty a.subscriptions
    a.subscribe("other") # in order after the unsub: once acked, the unsub was read
    db.notify("rc", "2")
    bcol.wait("b gets 2") { |s| s.payloads("rc") == %w[1 2] }
    db.notify("other", "sync")
    acol.wait("a's sync wake") { |s| s.payloads("other") == ["sync"] }
    assert_equal ["1"], acol.payloads("rc"), "a still got rc after its unsubscribe"
    # The last unsubscribe UNLISTENs; a new subscribe LISTENs again.
    b.unsubscribe("rc")
    b.subscribe("rc")
    db.notify("rc", "3")
    bcol.wait("b gets 3 after resubscribing") { |s| s.payloads("rc") == %w[1 2 3] }
  end

  def test_concurrent_subscribes_of_one_name_share_one_sub
    f, c = fake_client(:ack)
    10.times.map { Thread.new { c.subscribe("same") } }.each(&:join)
    assert_equal "same", f.subs.pop
    c.subscribe("marker")
    assert_equal "marker", f.subs.pop, "more than one sub frame for one name"
  end

  def test_invalid_names_are_refused_and_the_client_lives
    h = hub(prefix: "p" * 60)
    c, = connect(h)
    assert_raises(Listenhub::InvalidNameError) { c.subscribe("x" * 64) }
    assert_raises(Listenhub::InvalidNameError) { c.subscribe("a\0b") }
    assert_raises(Listenhub::InvalidNameError) { c.subscribe("\xff".b) }
    err = assert_raises(Listenhub::InvalidNameError) { c.subscribe("four") } # 64 bytes with the prefix: the hub's nack
    assert_match(/invalid/i, err.reason)
    assert_nil c.err
    c.subscribe("ok")
  end

  def test_hub_death_kills_the_client
    h = hub
    deaths = Queue.new
    c = Listenhub.connect(h.socket, on_death: ->(e) { deaths << e })
    cleanup { c.close }
    c.subscribe("x")
    h.kill
    err = deaths.pop
    assert_kind_of Listenhub::ConnError, err
    assert_equal "read", err.op
    assert_raises(Listenhub::ConnError) { c.subscribe("y") }
  end

  def test_close
    h = hub
    c, = connect(h)
    c.subscribe("x")
    c.close
    c.close
    assert_kind_of Listenhub::ClosedError, c.err
    assert_raises(Listenhub::ClosedError) { c.subscribe("y") }
  end

  def test_ack_timeout_kills_the_client
    _, c = fake_client(:silent, ack_timeout: 0.3)
    t0 = Listenhub.monotonic
    assert_raises(Listenhub::AckTimeoutError) { c.subscribe("x") }
    assert_operator Listenhub.monotonic - t0, :<, 5
    assert_kind_of Listenhub::AckTimeoutError, c.err
  end

  def test_nack_not_about_the_name_kills_the_client
    _, c = fake_client(:nack)
    assert_raises(Listenhub::NackError) { c.subscribe("x") }
    assert_kind_of Listenhub::NackError, c.err
  end

  def test_stalled_write_kills_the_client
    _, c = fake_client(:deaf, write_timeout: 0.3, ack_timeout: 30)
    LHTest.wait_for("the greeting") { c.instance_variable_get(:@greeted) }
    # Names of 60 bytes: the socket buffers fill, the write stalls.
    threads = 20_000.times.each_slice(500).map do |slice|
      Thread.new do
        slice.each do |i|
          c.subscribe(format("%060d", i), timeout: 0.001)
        rescue Listenhub::TimeoutError
          next
        rescue Listenhub::Error
          break
        end
      end
    end
    threads.each(&:join)
    c.wait(LHTest::TIMEOUT)
    assert_kind_of Listenhub::ConnError, c.err
    assert_equal "write", c.err.op
  end

  def test_refusal_before_status
    _, c = fake_client(:refuse)
    err = assert_raises(Listenhub::RefusedError) { c.subscribe("x") }
    assert_match(/not allowed/, err.message)
  end

  def test_stalled_partial_frame_times_out
    _, c = fake_client(:partial, frame_timeout: 0.3)
    c.wait(LHTest::TIMEOUT)
    assert_kind_of Listenhub::ConnError, c.err
    assert_match(/frame timeout/, c.err.message)
  end

  def test_missing_socket_is_a_dial_error
    err = assert_raises(Listenhub::ConnError) { Listenhub.connect(File.join(tmpdir, "none.sock")) }
    assert_equal "dial", err.op
  end
end
