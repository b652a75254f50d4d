'use strict';

// The hub client against a real hub and a real Postgres.

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');

const listenhub = require('..');
const { TIMEOUT, skip, tmpDir, Hub, DB, Collector, FakeHub } = require('./hubtest');

// A hub, a database connection and cleanup for one test.
async function setup(t) {
  const hub = await Hub.start(t.name);
  t.after(() => hub.kill());
  const db = await DB.open();
  t.after(() => db.close());
  const open = async (opts) => {
    const c = await listenhub.connect(hub.socket, opts);
    t.after(() => c.close());
    return c;
  };
  return { hub, db, open };
}

test('subscribe acks, then wakes with payload and durable', { skip }, async (t) => {
  const { db, open } = await setup(t);
  const col = new Collector();
  const c = await open({ onWake: col.onWake, onStatus: col.onStatus });
  await c.subscribe('orders');
  assert.deepEqual([...c.subscriptions()], ['orders']);
  // Committed after the ack: must arrive (rule 1).
  await db.notify('orders', 'hello');
  await db.notify('orders', '');
  await col.wait('both wakes', (s) => s.wakes.length >= 2);
  assert.deepEqual(col.wakes.slice(0, 2), [
    { type: 'wake', name: 'orders', payload: 'hello', durable: false },
    { type: 'wake', name: 'orders', payload: null, durable: true },
  ]);
});

test('a burst of 20,000 NOTIFYs in one transaction reaches a reading client in full', { skip }, async (t) => {
  // Far past the hub's 1,024-frame limit (River's InsertMany over 5,000
  // queues sends as many): a client that reads is not evicted, as its own
  // LISTEN would not have dropped them.
  const n = 20000;
  const { hub, db, open } = await setup(t);
  const col = new Collector();
  const c = await open({ onWake: col.onWake });
  await c.subscribe('burst');
  await db.conn.query("SELECT pg_notify('burst', 'q' || i) FROM generate_series(1, $1::int) i", [n]);
  try {
    await col.wait('the whole burst', (s) => s.wakes.length >= n);
  } catch (err) {
    throw new Error(`${col.wakes.length} of ${n} wakes arrived; hub log:\n${hub.output.slice(-3000)}`);
  }
  for (let i = 0; i < n; i++) {
    assert.equal(col.wakes[i].payload, `q${i + 1}`, `wake ${i}`);
  }
  // Still connected: a NOTIFY after the burst arrives.
  await db.notify('burst', 'after');
  await col.wait('the wake after the burst', (s) => s.wakes.length > n);
  assert.equal(col.wakes[n].payload, 'after');
  assert.doesNotMatch(hub.output, /worker evicted/);
});

test('status on connect and healthy()', { skip }, async (t) => {
  const { open } = await setup(t);
  const col = new Collector();
  const c = await open({ onStatus: col.onStatus });
  await col.wait('a status', (s) => s.statuses.length > 0);
  assert.equal(col.statuses[0], true);
  assert.equal(c.healthy(), true);
});

test('events() iterator without callbacks', { skip }, async (t) => {
  const { db, open } = await setup(t);
  const c = await open();
  await c.subscribe('it');
  await db.notify('it', 'p1');
  const got = [];
  for await (const ev of c.events()) {
    got.push(ev);
    if (ev.type === 'wake') break;
  }
  assert.deepEqual(got[0], { type: 'status', healthy: true });
  assert.deepEqual(got.at(-1), { type: 'wake', name: 'it', payload: 'p1', durable: false });
});

// A listener added while iterating (a debug log) takes nothing from the
// iterator, which the listener itself is (Symbol.asyncIterator); in callback
// mode the iterator sees the events from its first call on, the callbacks
// all of them.
test('events() and listeners never take from each other', { skip }, async (t) => {
  const { db, open } = await setup(t);
  const c = await open();
  await c.subscribe('both');
  const it = c[Symbol.asyncIterator](); // iterating from here on
  const debug = [];
  c.on('wake', (w) => debug.push(w)); // added while iterating
  await db.notify('both', 'p1');
  const got = [];
  for (;;) {
    const { value: ev, done } = await it.next();
    assert.ok(!done, 'the iterator ended');
    got.push(ev);
    if (ev.type === 'wake') break;
  }
  await it.return();
  assert.deepEqual(got.at(-1), { type: 'wake', name: 'both', payload: 'p1', durable: false });
  assert.deepEqual(debug, [got.at(-1)]);

  const seen = [];
  const cb = await open({ onWake: (w) => seen.push(w) });
  await cb.subscribe('both');
  assert.equal(await cb.get(0), null, 'callback mode queues nothing before the first get()');
  await db.notify('both', 'p2');
  let ev = await cb.get(TIMEOUT);
  while (ev && ev.type === 'status') ev = await cb.get(TIMEOUT); // a periodic re-send
  assert.deepEqual(ev, { type: 'wake', name: 'both', payload: 'p2', durable: false });
  assert.deepEqual(seen, [ev]);
});

test('LimitError is not an InvalidNameError', () => {
  const e = new listenhub.LimitError('a', 'too many subscriptions');
  assert.ok(e instanceof listenhub.ListenhubError);
  assert.ok(!(e instanceof listenhub.InvalidNameError));
  assert.equal(e.subscriptionName, 'a');
  assert.equal(e.name, 'LimitError');
});

test('invalid names are refused and the client lives', { skip }, async (t) => {
  const { open } = await setup(t);
  const c = await open();
  // 64 bytes: refused without a round trip.
  await assert.rejects(c.subscribe('x'.repeat(64)), listenhub.InvalidNameError);
  // Empty: the hub's nack ("invalid channel: ..."), not a dead hub.
  await assert.rejects(c.subscribe(''), (e) => e instanceof listenhub.InvalidNameError && e.reason.includes('invalid channel'));
  assert.equal(c.err, null);
  await c.subscribe('fine');
  assert.deepEqual([...c.subscriptions()], ['fine']);
});

test('unsubscribe stops delivery', { skip }, async (t) => {
  const { db, open } = await setup(t);
  const col = new Collector();
  const c = await open({ onWake: col.onWake });
  await c.subscribe('a');
  await c.subscribe('b');
  c.unsubscribe('a');
  await c.subscribe('c'); // a round trip after the unsub: the hub processed it
  await db.notify('a', 'lost');
  await db.notify('b', 'kept');
  await col.wait('the wake of b', (s) => s.has('b', 'kept', false));
  assert.ok(!col.wakes.some((w) => w.name === 'a'), JSON.stringify(col.wakes));
});

test('the hub dying kills the client', { skip }, async (t) => {
  const { hub, open } = await setup(t);
  const c = await open();
  await c.subscribe('x');
  await hub.kill();
  const err = await c.wait();
  assert.ok(err instanceof listenhub.ConnError, String(err));
  assert.equal(c.healthy(), false);
  await assert.rejects(c.subscribe('y'), listenhub.ConnError);
});

test('close', { skip }, async (t) => {
  const { open } = await setup(t);
  const c = await open();
  await c.subscribe('x');
  c.close();
  assert.ok(c.err instanceof listenhub.ClosedError);
  await assert.rejects(c.subscribe('x'), listenhub.ClosedError);
  c.close(); // idempotent
});

test('subscribe with an aborted signal leaves the client alive', { skip }, async (t) => {
  const { open } = await setup(t);
  const c = await open();
  const ac = new AbortController();
  const p = c.subscribe('abandoned', { signal: ac.signal });
  ac.abort(new Error('gave up'));
  await assert.rejects(p, /gave up/);
  await c.subscribe('other');
  assert.equal(c.err, null);
});

// A client of a fake hub in mode (connect options: opts); both are closed
// after the test.
async function fakeClient(t, mode, opts) {
  const fake = await FakeHub.start(mode);
  t.after(() => fake.close());
  const c = await listenhub.connect(fake.socket, opts);
  t.after(() => c.close());
  return c;
}

test('ack timeout kills the client', async (t) => {
  const c = await fakeClient(t, 'silent', { ackTimeout: 300 });
  await assert.rejects(c.subscribe('q'), listenhub.AckTimeoutError);
  assert.ok(c.err instanceof listenhub.AckTimeoutError);
});

test('a nack not about the name kills the client', async (t) => {
  const c = await fakeClient(t, 'nack');
  await assert.rejects(c.subscribe('q'), listenhub.NackError);
  assert.ok(c.err instanceof listenhub.NackError);
});

test('a stalled write kills the client', async (t) => {
  const c = await fakeClient(t, 'deaf', { writeTimeout: 300, ackTimeout: 60000 });
  // Each call queues a sub frame (about 80 bytes) that is never answered:
  // far more bytes than the socket buffers hold, for a hub that never reads.
  const pending = [];
  for (let i = 0; i < 10000; i++) pending.push(c.subscribe('n'.repeat(50) + String(i).padStart(5, '0')));
  const err = await c.wait();
  assert.ok(err instanceof listenhub.ConnError, String(err));
  assert.equal(err.op, 'write');
  // Every waiting subscribe gets the client's error.
  await assert.rejects(pending[0], (e) => e === err);
});

test('a missing socket is a dial error', async () => {
  await assert.rejects(listenhub.connect(path.join(tmpDir('lhnode-'), 'none.sock')), (e) => e instanceof listenhub.ConnError && e.op === 'dial');
});

void TIMEOUT;

// node-postgres's style: 'wake' and 'status' events, 'error' once at a
// death other than close(), 'end' after it, and close() a promise that
// resolves once the socket is closed.
test('events: wake, status, error, end; close() resolves', { skip }, async (t) => {
  const { hub, db, open } = await setup(t);
  const c = await open();
  const wakes = [];
  const statuses = [];
  const errors = [];
  let ended = null;
  c.on('wake', (w) => wakes.push(w));
  c.on('status', (h) => statuses.push(h));
  c.on('error', (e) => errors.push(e));
  c.on('end', (e) => {
    ended = e;
  });
  await c.subscribe('emitted');
  await db.notify('emitted', 'p');
  const deadline = Date.now() + TIMEOUT;
  while (wakes.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(wakes[0], { type: 'wake', name: 'emitted', payload: 'p', durable: false });
  assert.equal(statuses[0], true);
  assert.equal(await c.get(0), null, 'a wake with a listener is not queued too');
  hub.kill();
  const err = await c.done;
  assert.ok(err instanceof listenhub.ConnError, `died of ${err}`);
  assert.deepEqual(errors, [err]);
  assert.equal(ended, err);

  // close(): no 'error', 'end' with ClosedError, and a promise.
  const hub2 = await Hub.start(t.name + ' 2');
  t.after(() => hub2.kill());
  const c2 = await listenhub.connect(hub2.socket);
  const errors2 = [];
  c2.on('error', (e) => errors2.push(e));
  const closed = c2.close();
  assert.ok(closed instanceof Promise);
  await closed;
  assert.deepEqual(errors2, []);
  assert.ok(c2.err instanceof listenhub.ClosedError);
});

// A death without an 'error' listener does not throw: done carries it.
test('no error listener: a death does not throw', { skip }, async (t) => {
  const { hub, open } = await setup(t);
  const c = await open();
  await c.subscribe('quiet');
  hub.kill();
  const err = await c.done;
  assert.ok(err instanceof listenhub.ConnError);
});
