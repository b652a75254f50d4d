'use strict';

// Failover against a real hub and a real Postgres: the hub is killed, the
// client goes on with its own LISTEN connection.

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const pg = require('pg');

const listenhub = require('..');
const { DATABASE_URL, skip, tmpDir, waitFor, Hub, DB, Collector, FakeHub } = require('./hubtest');

const PREFIX = 'lh.';
const SUFFIX = '.ev';
// Needs quoting (a dot, capitals, a double quote): the local LISTEN must
// send it as a quoted identifier with the quote doubled.
const ODD = 'Mixed"Case.q';

async function setup(t) {
  const db = await DB.open();
  t.after(() => db.close());
  const col = new Collector();
  const app = ('lhnode-local-' + t.name.replace(/[^a-zA-Z0-9]+/g, '-')).slice(0, 60);
  const failover = async (socketPath, opts = {}) => {
    const f = await listenhub.Failover.create(socketPath, {
      databaseUrl: DATABASE_URL,
      channelPrefix: PREFIX,
      channelSuffix: SUFFIX,
      applicationName: app,
      onWake: col.onWake,
      onStatus: col.onStatus,
      ...opts,
    });
    t.after(() => f.close());
    return f;
  };
  const hub = async (socket = '') => {
    const h = await Hub.start(t.name, { prefix: PREFIX, suffix: SUFFIX, socket });
    t.after(() => h.kill());
    return h;
  };
  const notify = (q, payload = '') => db.notify(PREFIX + q + SUFFIX, payload);
  return { db, col, app, failover, hub, notify };
}

// otherDatabase creates a database beside the test's and returns its name;
// at the test's end before (a hub on it killed, say) runs, then the
// database is dropped. One hook, in this order: node:test runs a test's
// after hooks in the order they were added, and setup's close the
// listeners afterwards.
async function otherDatabase(t, name, before) {
  const admin = new pg.Client({ connectionString: DATABASE_URL, application_name: 'lhnode-admin' });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${name}`);
  await admin.query(`CREATE DATABASE ${name}`);
  t.after(async () => {
    await before();
    await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.end();
  });
  return name;
}

// laterProxy reserves a port where nothing listens yet (Postgres down, as
// a refused connection); via(url) is url through it, and up() starts
// forwarding it to the test's server. Closed at the test's end.
async function laterProxy(t) {
  const net = require('node:net');
  const port = await new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
  const real = new URL(DATABASE_URL);
  let server = null;
  const conns = new Set();
  t.after(() => {
    if (!server) return undefined;
    for (const c of conns) c.destroy(); // a hub's connection would hold close() open
    return new Promise((r) => server.close(r));
  });
  return {
    via(url) {
      const u = new URL(url);
      u.hostname = '127.0.0.1';
      u.port = String(port);
      return u.toString();
    },
    async up() {
      server = net.createServer((c) => {
        const s = net.connect(Number(real.port || 5432), real.hostname);
        conns.add(c).add(s);
        c.pipe(s);
        s.pipe(c);
        const end = () => { c.destroy(); s.destroy(); conns.delete(c); conns.delete(s); };
        c.on('error', end);
        s.on('error', end);
        c.on('close', end);
        s.on('close', end);
      });
      await new Promise((r) => server.listen(port, '127.0.0.1', r));
    },
  };
}

test('hub killed: fails over to a local LISTEN', { skip }, async (t) => {
  const { db, col, app, failover, hub, notify } = await setup(t);
  const h = await hub();
  const reasons = [];
  const f = await failover(h.socket, { onFailover: (r) => reasons.push(r) });
  await f.subscribe('jobs');
  await f.subscribe(ODD);
  assert.equal(f.mode(), listenhub.HUB);
  assert.equal(await db.backends(app), 0);
  await notify('jobs', 'via-hub');
  await col.wait('a wake through the hub', (s) => s.has('jobs', 'via-hub', false));

  await h.kill();
  await waitFor('local mode', () => f.mode() === listenhub.LOCAL);
  // One durable wake per recorded name after the swap.
  await col.wait('a durable wake per name', (s) => s.has('jobs', null, true) && s.has(ODD, null, true));
  assert.equal(col.count('jobs', null, true), 1);
  assert.equal(col.count(ODD, null, true), 1);
  assert.equal(reasons.length, 1);
  assert.ok(reasons[0] instanceof listenhub.ConnError, String(reasons[0]));
  assert.ok(col.statuses.includes(false));
  assert.equal(await db.backends(app), 1);
  assert.equal(f.healthy(), true);

  // Later NOTIFYs come through the local connection, mapped back.
  await notify('jobs', 'via-local');
  await notify(ODD, 'odd');
  await col.wait('wakes through the local listener', (s) => s.has('jobs', 'via-local', false) && s.has(ODD, 'odd', false));
  // Subscribe and unsubscribe in local mode.
  await f.subscribe('later');
  f.unsubscribe('jobs');
  await f.subscribe('sync-point'); // LISTEN/UNLISTEN run in call order
  await notify('jobs', 'gone');
  await notify('later', 'new');
  await col.wait('a wake for a name subscribed in local mode', (s) => s.has('later', 'new', false));
  assert.ok(!col.has('jobs', 'gone', false));
  assert.deepEqual([...f.subscriptions()].sort(), [ODD, 'later', 'sync-point'].sort());

  f.close();
  await waitFor('the local backend gone', async () => (await db.backends(app)) === 0);
});

test('hub back: fails back, and fails over again', { skip }, async (t) => {
  const { db, col, app, failover, hub, notify } = await setup(t);
  const h = await hub();
  let failbacks = 0;
  const f = await failover(h.socket, { minLocal: 200, probeInterval: 100, onFailback: () => failbacks++ });
  await f.subscribe('jobs');
  await h.kill();
  await waitFor('local mode', () => f.mode() === listenhub.LOCAL);
  await col.wait('the durable wake of the failover', (s) => s.count('jobs', null, true) === 1);
  assert.equal(await db.backends(app), 1);
  await f.subscribe('while-local'); // recorded: the fail-back subscribes it on the hub too

  // A new hub on the same socket (the old file is stale).
  const h2 = await hub(h.socket);
  await waitFor('back on the hub', () => f.mode() === listenhub.HUB);
  assert.equal(failbacks, 1);
  assert.equal(f.reason, null);
  // One durable wake per name after the fail-back as well.
  await col.wait('the durable wakes of the fail-back', (s) => s.count('jobs', null, true) === 2 && s.count('while-local', null, true) === 1);
  // Make before break: the local listener is closed after the swap.
  await waitFor('the local backend gone', async () => (await db.backends(app)) === 0);
  await notify('while-local', 'via-new-hub');
  await col.wait('a wake through the new hub', (s) => s.has('while-local', 'via-new-hub', false));
  assert.equal(f.healthy(), true);

  // The cycle repeats.
  await h2.kill();
  await waitFor('local mode again', () => f.mode() === listenhub.LOCAL);
  await col.wait('the durable wake of the second failover', (s) => s.count('jobs', null, true) === 3);
});

test('fail-back loses no NOTIFY', { skip }, async (t) => {
  const { col, failover, hub } = await setup(t);
  const h = await hub();
  const f = await failover(h.socket, { minLocal: 200, probeInterval: 100 });
  await f.subscribe('stream');
  await h.kill();
  await waitFor('local mode', () => f.mode() === listenhub.LOCAL);
  // NOTIFYs committed back to back across the whole fail-back, from a
  // connection of their own.
  const pumpDb = await DB.open();
  t.after(() => pumpDb.close());
  const sent = [];
  let stop = false;
  const pump = (async () => {
    for (let i = 0; !stop; i++) {
      await pumpDb.notify(PREFIX + 'stream' + SUFFIX, String(i));
      sent.push(String(i));
    }
  })();
  try {
    await hub(h.socket);
    await waitFor('back on the hub', () => f.mode() === listenhub.HUB);
    const n = sent.length;
    await waitFor('NOTIFYs after the fail-back', () => sent.length > n + 100);
  } finally {
    stop = true;
    await pump;
  }
  await col.wait('every committed payload', (s) => {
    const got = new Set(s.wakes.map((w) => w.payload));
    return sent.every((p) => got.has(p));
  });
  assert.ok(sent.length > 100);
});

// Numbered NOTIFYs at 500 a second through 20 fail-backs (the hub killed
// while the sender pauses, so that the failover's own gap is not counted;
// restarted while it sends): each arrives once, in commit order.
test('fail-back is exact through 20 fail-backs', { skip }, async (t) => {
  const { col, failover, hub } = await setup(t);
  let h = await hub();
  let backs = 0;
  const f = await failover(h.socket, { minLocal: 100, probeInterval: 50, probeMaxInterval: 200, onFailback: () => backs++ });
  await f.subscribe('seq');
  const pumpDb = await DB.open();
  t.after(() => pumpDb.close());
  let sent = 0;
  let paused = false;
  let stop = false;
  let idle = Promise.resolve();
  const pump = (async () => {
    while (!stop) {
      if (!paused) {
        sent++;
        idle = pumpDb.notify(PREFIX + 'seq' + SUFFIX, 'n' + sent);
        await idle;
      }
      await new Promise((r) => setTimeout(r, 2));
    }
  })();
  const seqs = (s) => s.wakes.filter((w) => w.name === 'seq' && /^n\d+$/.test(w.payload || '')).map((w) => Number(w.payload.slice(1)));
  const upto = (n) => col.wait(`seq ${n}`, (s) => Math.max(0, ...seqs(s)) >= n);
  try {
    await upto(10);
    for (let i = 0; i < 20; i++) {
      paused = true;
      await idle;
      const at = sent;
      await upto(at);
      await h.kill();
      await waitFor('local mode', () => f.mode() === listenhub.LOCAL);
      paused = false;
      await upto(at + 10);
      h = await hub(h.socket);
      await waitFor(`fail-back ${i + 1}`, () => backs === i + 1);
      assert.equal(f.mode(), listenhub.HUB);
      await upto(sent + 10);
    }
  } finally {
    stop = true;
    await pump;
  }
  await upto(sent);
  const got = seqs(col);
  const seen = new Set();
  const dups = got.filter((n) => (seen.has(n) ? true : (seen.add(n), false)));
  const lost = [];
  for (let n = 1; n <= sent; n++) if (!seen.has(n)) lost.push(n);
  assert.deepEqual(dups, [], 'delivered twice through 20 fail-backs');
  assert.deepEqual(lost, [], 'lost through 20 fail-backs');
  assert.deepEqual(got, [...got].sort((a, b) => a - b), 'out of commit order');
});

test('refused fail-backs lose nothing', { skip }, async (t) => {
  // A hub on another database on the socket: every fail-back attempt's
  // marker passes the local listener and never the hub, and the local
  // wakes held after the marker are delivered when the attempt is given
  // up. Numbered NOTIFYs through 10 refused attempts (one hub connection
  // each): every one arrives once, in commit order.
  let h = null;
  const other = await otherDatabase(t, `lhnode_refused_${process.pid}`, async () => {
    if (h) await h.kill();
  });
  const { col, failover } = await setup(t);
  const socket = path.join(tmpDir('lhnode-'), 'hub.sock');
  const f = await failover(socket, { minLocal: 50, probeInterval: 50, probeMaxInterval: 100, ackTimeout: 500 });
  await f.subscribe('seq');
  assert.equal(f.mode(), listenhub.LOCAL);
  const pumpDb = await DB.open();
  t.after(() => pumpDb.close());
  let sent = 0;
  let stop = false;
  const pump = (async () => {
    while (!stop) {
      sent++;
      await pumpDb.notify(PREFIX + 'seq' + SUFFIX, 'n' + sent);
      await new Promise((r) => setTimeout(r, 3));
    }
  })();
  const url = new URL(DATABASE_URL);
  url.pathname = '/' + other;
  const attempts = () => (h ? (h.output.match(/worker connected/g) || []).length : 0);
  try {
    h = await Hub.start(t.name, { prefix: PREFIX, suffix: SUFFIX, socket, args: ['--database-url', url.toString()] });
    await waitFor('10 refused fail-back attempts', () => attempts() >= 13, 60000);
  } finally {
    stop = true;
    await pump;
  }
  const seqs = (s) => s.wakes.filter((w) => w.name === 'seq' && /^n\d+$/.test(w.payload || '')).map((w) => Number(w.payload.slice(1)));
  await col.wait('the last NOTIFY', (s) => Math.max(0, ...seqs(s)) >= sent);
  assert.equal(f.mode(), listenhub.LOCAL);
  const got = seqs(col);
  const seen = new Set();
  const dups = got.filter((n) => (seen.has(n) ? true : (seen.add(n), false)));
  const lost = [];
  for (let n = 1; n <= sent; n++) if (!seen.has(n)) lost.push(n);
  assert.deepEqual(lost, [], `lost through ${attempts() - 1} refused fail-backs`);
  assert.deepEqual(dups, [], 'delivered twice through refused fail-backs');
  assert.deepEqual(got, [...got].sort((a, b) => a - b), 'out of commit order');
});

test('Postgres down at start: the worker stays on the hub and works once it is up', { skip }, async (t) => {
  // The hub up, its Postgres not (a port where nothing listens yet): the
  // Failover stays on the hub, is told healthy false, and its subscribe
  // waits past its ack timeout and the hub's old 5 s command timeout,
  // instead of failing over to a local listener that cannot connect
  // either. Once Postgres is up the sub is acked and a NOTIFY arrives.
  const { col, failover, notify } = await setup(t);
  const proxy = await laterProxy(t);
  const down = proxy.via(DATABASE_URL);
  const h = await Hub.start(t.name, { prefix: PREFIX, suffix: SUFFIX, args: ['--database-url', down], ready: false });
  t.after(() => h.kill());
  const f = await failover(h.socket, { databaseUrl: down, ackTimeout: 1000 });
  assert.equal(f.mode(), listenhub.HUB);
  let result = null;
  const sub = f.subscribe('a').then(() => (result = 'ok'), (e) => (result = e));
  await new Promise((r) => setTimeout(r, 7000)); // seven ack timeouts: the sub must still wait
  assert.equal(result, null, `subscribe settled while Postgres is down: ${result}`);
  assert.equal(f.mode(), listenhub.HUB);
  assert.ok(col.statuses.includes(false) && !col.statuses.includes(true), `statuses ${col.statuses}`);
  await proxy.up();
  await sub;
  assert.equal(result, 'ok');
  await notify('a', 'after');
  await col.wait('the wake through the hub', (s) => s.has('a', 'after', false));
  assert.equal(f.mode(), listenhub.HUB);
});

test('an unverified hub on another database is refused once it is up', { skip }, async (t) => {
  // A hub on another database whose Postgres is down when the Failover
  // starts cannot be checked then, and is not trusted either: its wakes
  // wait until it says healthy and the check runs, which finds the other
  // database; the Failover listens on its own connection and delivers
  // this database's NOTIFYs, none of the other's.
  let h = null;
  const other = await otherDatabase(t, `lhnode_unverified_${process.pid}`, async () => {
    if (h) await h.kill();
  });
  const { col, failover, notify } = await setup(t);
  const proxy = await laterProxy(t);
  const otherUrl = new URL(DATABASE_URL);
  otherUrl.pathname = '/' + other;
  h = await Hub.start(t.name, { prefix: PREFIX, suffix: SUFFIX, args: ['--database-url', proxy.via(otherUrl.toString())], ready: false });
  const warnings = [];
  const onWarning = (w) => warnings.push(w.message);
  process.on('warning', onWarning);
  t.after(() => process.off('warning', onWarning));
  const f = await failover(h.socket, { ackTimeout: 1000 });
  assert.equal(f.mode(), listenhub.HUB);
  const sub = f.subscribe('a').catch((e) => e);
  await proxy.up();
  await waitFor('local mode once the check ran', () => f.mode() === listenhub.LOCAL);
  assert.ok(f.reason instanceof listenhub.OtherDatabaseError, `reason ${f.reason}`);
  assert.equal(await sub, undefined);
  await waitFor('subscribed locally', () => f.subscriptions().has('a'));
  const oc = new pg.Client({ connectionString: otherUrl.toString(), application_name: 'lhnode-other' });
  await oc.connect();
  await oc.query('SELECT pg_notify($1, $2)', [PREFIX + 'a' + SUFFIX, 'foreign']);
  await oc.end();
  await notify('a', 'ours');
  await col.wait('our NOTIFY', (s) => s.has('a', 'ours', false));
  assert.ok(!col.has('a', 'foreign', false), 'the other database\'s NOTIFY was delivered');
  assert.ok(warnings.some((m) => m.includes('does not deliver the notifications of')));
});

test('a frozen hub fails over', { skip }, async (t) => {
  // A frozen hub (SIGSTOPped: its socket open, nothing read or written) is
  // a dead hub: no frame for silenceTimeout, though it re-sends its status
  // every 5 status intervals (1 s here), and the Failover listens on its
  // own connection; a NOTIFY committed during the freeze arrives through it.
  const { col, failover, hub, notify } = await setup(t);
  const h = await hub();
  const f = await failover(h.socket, { silenceTimeout: 3000 });
  await f.subscribe('a');
  assert.equal(f.mode(), listenhub.HUB);
  process.kill(h.proc.pid, 'SIGSTOP');
  t.after(() => {
    try {
      process.kill(h.proc.pid, 'SIGCONT');
    } catch (e) {
      // already gone
    }
  });
  await waitFor('local mode after the hub froze', () => f.mode() === listenhub.LOCAL);
  assert.match(String(f.reason && (f.reason.message || f.reason)), /no frame from the hub/);
  await notify('a', 'during the freeze');
  await col.wait('the wake through the local listener', (s) => s.has('a', 'during the freeze', false));
});

test('close() during a fail-back attempt leaves no timer behind', { skip }, async (t) => {
  // A fail-back attempt waits (up to the ack timeout) for a marker a hub on
  // another database never delivers; close() meanwhile must leave nothing
  // that keeps the process alive: no timer of the attempt, no next attempt.
  let h = null;
  const other = await otherDatabase(t, `lhnode_close_${process.pid}`, async () => {
    if (h) await h.kill();
  });
  const socket = path.join(tmpDir('lhnode-'), 'hub.sock');
  const url = new URL(DATABASE_URL);
  url.pathname = '/' + other;
  const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
  const baseline = timers();
  const f = await listenhub.Failover.create(socket, {
    databaseUrl: DATABASE_URL, minLocal: 50, probeInterval: 50, probeMaxInterval: 100, ackTimeout: 5000,
  });
  assert.equal(f.mode(), listenhub.LOCAL);
  h = await Hub.start(t.name, { socket, args: ['--database-url', url.toString()] });
  const readiness = (h.output.match(/worker connected/g) || []).length;
  await waitFor('a fail-back attempt connected', () => (h.output.match(/worker connected/g) || []).length > readiness);
  await f.close();
  await new Promise((r) => setImmediate(r));
  assert.ok(timers() <= baseline, `${timers()} timers left after close(), ${baseline} before: ${process.getActiveResourcesInfo()}`);
});

test('the local listener runs one command at a time, its health check included', { skip }, async (t) => {
  // pg runs one query at a time on a client: the health check's round
  // trip must wait for the LISTENs and UNLISTENs queued before it, never
  // run beside them.
  const l = await listenhub.Local.create({ databaseUrl: DATABASE_URL, channelPrefix: PREFIX, channelSuffix: SUFFIX });
  t.after(() => l.close());
  const conn = l._conn;
  const query = conn.query.bind(conn);
  let inFlight = 0;
  let overlaps = 0;
  conn.query = (...args) => {
    inFlight++;
    if (inFlight > 1) overlaps++;
    const p = query(...args);
    p.then(() => inFlight--, () => inFlight--);
    return p;
  };
  const subs = [];
  for (let i = 0; i < 50; i++) {
    subs.push(l.subscribe(`c${i}`));
    if (i % 10 === 0) {
      l._lastTraffic = 0; // due now
      l._check();
    }
  }
  await Promise.all(subs);
  await l.sync();
  assert.equal(overlaps, 0, 'a query ran beside another on the local connection');
});

test('oneWay stays local', { skip }, async (t) => {
  const { db, app, failover, hub } = await setup(t);
  const h = await hub();
  const f = await failover(h.socket, { oneWay: true, minLocal: 50, probeInterval: 50 });
  await f.subscribe('jobs');
  await h.kill();
  await waitFor('local mode', () => f.mode() === listenhub.LOCAL);
  await hub(h.socket);
  // Without oneWay this fails back within about 100 ms (the test above);
  // twenty times that without it is the one-way rule.
  await new Promise((r) => setTimeout(r, 2000));
  assert.equal(f.mode(), listenhub.LOCAL);
  assert.equal(await db.backends(app), 1);
});

test('no hub at start: local mode at once', { skip }, async (t) => {
  const { col, failover, notify } = await setup(t);
  const f = await failover(path.join(tmpDir('lhnode-'), 'absent.sock'));
  assert.equal(f.mode(), listenhub.LOCAL);
  assert.ok(f.reason instanceof listenhub.ConnError);
  await f.subscribe('jobs');
  await notify('jobs', 'x');
  await col.wait('a local wake', (s) => s.has('jobs', 'x', false));
});

test('a hub on another database is refused at start', { skip }, async (t) => {
  // A hub serving another database acks every subscribe and delivers none
  // of this one's NOTIFYs: the Failover finds out at start (a NOTIFY of a
  // private name that does not come back through the hub), warns, and
  // listens on its own connection.
  let h = null;
  const other = await otherDatabase(t, `lhnode_other_${process.pid}`, async () => {
    if (h) await h.kill();
  });
  const { col, failover, notify } = await setup(t);
  const url = new URL(DATABASE_URL);
  url.pathname = '/' + other;
  h = await Hub.start(t.name, { prefix: PREFIX, suffix: SUFFIX, args: ['--database-url', url.toString()] });
  const warnings = [];
  const onWarning = (w) => warnings.push(w.message);
  process.on('warning', onWarning);
  t.after(() => process.off('warning', onWarning));
  const f = await failover(h.socket);
  assert.equal(f.mode(), listenhub.LOCAL);
  assert.ok(f.reason instanceof listenhub.OtherDatabaseError, `reason ${f.reason}`);
  await waitFor('the warning', () => warnings.some((m) => m.includes('does not deliver the notifications of')));
  await f.subscribe('jobs');
  await notify('jobs', 'through-our-own');
  await col.wait('the wake through the local listener', (s) => s.has('jobs', 'through-our-own', false));
});

test('the local listener reconnects and resyncs', { skip }, async (t) => {
  const { db, col, app, failover, notify } = await setup(t);
  const f = await failover(path.join(tmpDir('lhnode-'), 'absent.sock'));
  await f.subscribe('jobs');
  await db.conn.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1', [app]);
  // Lost, reconnected and re-LISTENed, then one durable wake.
  await col.wait('unhealthy then healthy', (s) => s.statuses.slice(-2).join() === 'false,true');
  await col.wait('the durable wake after the reconnect', (s) => s.has('jobs', null, true));
  assert.equal(f.healthy(), true);
  await notify('jobs', 'after');
  await col.wait('a wake on the new connection', (s) => s.has('jobs', 'after', false));
});

test('an invalid name does not fail over', { skip }, async (t) => {
  const { failover, hub } = await setup(t);
  const h = await hub();
  const f = await failover(h.socket);
  await f.subscribe('ok');
  // A fine name, but 66 bytes once prefixed and suffixed: the hub nacks it.
  await assert.rejects(f.subscribe('n'.repeat(60)), listenhub.InvalidNameError);
  assert.equal(f.mode(), listenhub.HUB);
  assert.deepEqual([...f.subscriptions()], ['ok']);
});

test('ack timeout fails over', { skip }, async (t) => {
  const { col, failover, notify } = await setup(t);
  const fake = await FakeHub.start('silent');
  t.after(() => fake.close());
  const f = await failover(fake.socket, { ackTimeout: 300 });
  await f.subscribe('jobs'); // the ack never comes: answered by the local listener
  assert.equal(f.mode(), listenhub.LOCAL);
  assert.ok(f.reason instanceof listenhub.AckTimeoutError, String(f.reason));
  await col.wait('the durable wake after the swap', (s) => s.has('jobs', null, true));
  await notify('jobs', 'y');
  await col.wait('a local wake', (s) => s.has('jobs', 'y', false));
});

test('a nack not about the name fails over', { skip }, async (t) => {
  const { failover } = await setup(t);
  const fake = await FakeHub.start('nack');
  t.after(() => fake.close());
  const f = await failover(fake.socket);
  await f.subscribe('jobs');
  assert.equal(f.mode(), listenhub.LOCAL);
  assert.ok(f.reason instanceof listenhub.NackError, String(f.reason));
});

test('events() iterator across the failover', { skip }, async (t) => {
  const { app, hub } = await setup(t);
  const h = await hub();
  const f = await listenhub.Failover.create(h.socket, { databaseUrl: DATABASE_URL, channelPrefix: PREFIX, channelSuffix: SUFFIX, applicationName: app });
  t.after(() => f.close());
  await f.subscribe('it');
  await h.kill();
  const got = [];
  for (;;) {
    const ev = await f.get(20000);
    assert.ok(ev, `no event in time; got ${JSON.stringify(got)}`);
    got.push(ev);
    if (ev.type === 'wake' && ev.name === 'it' && ev.durable) break;
  }
  assert.equal(f.mode(), listenhub.LOCAL);
  assert.ok(got.some((e) => e.type === 'status' && e.healthy === false));
});
