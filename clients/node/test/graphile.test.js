'use strict';

// graphile-worker 0.18 (from npm) on the hub, with real processes: K worker
// processes (test/gwproc.mjs, each graphile-worker's run()) hold K LISTEN
// backends on their own pools and one (the hub's) through hubPool; a job
// added from outside runs through the wake, well before the poll interval
// (60 s); the hub SIGKILLed and restarted while jobs are added loses none
// and delays none to a poll.

const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const net = require('node:net');
const path = require('node:path');
const readline = require('node:readline');

const { DATABASE_URL, skip, waitFor, Hub, DB } = require('./hubtest');

const K = 4;
// The poll interval of gwproc.mjs is 60 s: a job run within this was woken.
const WOKEN = 10000;

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// K worker processes; ran collects what their jobs print.
function startWorkers(t, mode, schema, app, socket, ran) {
  const procs = [];
  for (let i = 0; i < K; i++) {
    const p = spawn(process.execPath, [path.join(__dirname, 'gwproc.mjs')], {
      env: { ...process.env, LHGW_MODE: mode, LHGW_SCHEMA: schema, LHGW_APP: app, LHGW_SOCKET: socket || '' },
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    p.listening = false;
    p.exited = new Promise((resolve) => p.on('exit', resolve));
    readline.createInterface({ input: p.stdout }).on('line', (line) => {
      if (line === 'listening') p.listening = true;
      else if (line.startsWith('{')) ran.push(JSON.parse(line));
    });
    t.after(() => p.kill('SIGKILL'));
    procs.push(p);
  }
  return procs;
}

async function stopWorkers(procs) {
  for (const p of procs) p.stdin.end();
  await Promise.all(procs.map((p) => p.exited));
}

// LISTEN backends of graphile-worker's own (its listener's last statement).
async function plainListeners(db, app) {
  const r = await db.conn.query("SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'", [app]);
  return r.rows[0].n;
}

// Subscribers of jobs:insert at the hub.
async function hubSubscribers(metrics) {
  try {
    const res = await fetch(`http://${metrics}/channels`);
    const body = await res.json();
    const list = Array.isArray(body) ? body : body.channels || [];
    const c = list.find((x) => x.name === 'jobs:insert');
    return c ? c.subscribers : 0;
  } catch {
    return 0;
  }
}

function addJob(db, schema, n) {
  return db.conn.query(`SELECT ${schema}.add_job('lhgw', $1::json)`, [JSON.stringify({ n, addedAt: Date.now() })]);
}

test('graphile-worker: K processes, 1 LISTEN backend through the hub, woken jobs, a hub kill loses none', { skip }, async (t) => {
  const gw = await import('graphile-worker');
  const db = await DB.open();
  const schema = `lhgw_${process.pid}`;
  // One hook: node:test runs after hooks in the order they were added.
  t.after(async () => {
    await db.conn.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`).catch(() => {});
    await db.close();
  });
  await gw.runMigrations({ connectionString: DATABASE_URL, schema, logger: new gw.Logger(() => () => {}) });
  let n = 0;

  // Without the hub: one LISTEN backend per process.
  const plainApp = 'lhgw-plain';
  const ran = [];
  let procs = startWorkers(t, 'plain', schema, plainApp, '', ran);
  await waitFor('every process LISTENing', async () => (await plainListeners(db, plainApp)) === K);
  const without = await plainListeners(db, plainApp);
  for (let i = 0; i < 3; i++) await addJob(db, schema, n++);
  await waitFor('the jobs run', () => ran.length === 3);
  await stopWorkers(procs);

  // Through the hub: one, the hub's.
  const metrics = `127.0.0.1:${await freePort()}`;
  const h = await Hub.start(t.name, { args: ['--metrics-addr', metrics] });
  t.after(() => h.kill());
  const localApp = 'lhgw-local';
  ran.length = 0;
  procs = startWorkers(t, 'hub', schema, localApp, h.socket, ran);
  await waitFor('every process subscribed at the hub', async () => (await hubSubscribers(metrics)) === K);
  const through = (await db.backends(localApp)) + (await db.backends(h.app));
  t.diagnostic(`census, ${K} graphile-worker processes: ${without} LISTEN backends on their own, ${through} through the hub`);
  assert.equal(without, K);
  assert.equal(through, 1);
  const first = n;
  for (let i = 0; i < 3; i++) await addJob(db, schema, n++);
  await waitFor('the jobs run through the hub', () => ran.length === 3);
  for (const r of ran) assert.ok(r.latency < WOKEN, `job ${r.n} ran ${r.latency} ms after it was added: not woken`);

  // The hub killed and restarted while jobs are added every 100 ms.
  let adding = true;
  const adder = (async () => {
    while (adding) {
      await addJob(db, schema, n++);
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  // The flow goes on through each step: a few more jobs added each time.
  const more = async (k) => {
    const want = n + k;
    await waitFor('more jobs added', () => n >= want);
  };
  await more(3);
  await h.kill();
  await waitFor('every process on a LISTEN of its own', async () => (await db.backends(localApp)) === K);
  await more(3);
  const h2 = await Hub.start(t.name, { socket: h.socket, args: ['--metrics-addr', metrics] });
  t.after(() => h2.kill());
  await waitFor('every process back on the hub', async () => (await db.backends(localApp)) === 0 && (await hubSubscribers(metrics)) === K);
  await more(3);
  adding = false;
  await adder;
  const want = n - first;
  await waitFor('every job run', () => ran.length >= want, 2 * WOKEN);
  const seen = new Map();
  for (const r of ran) seen.set(r.n, (seen.get(r.n) || 0) + 1);
  for (let i = first; i < n; i++) assert.equal(seen.get(i), 1, `job ${i} ran ${seen.get(i) || 0} times`);
  const worst = Math.max(...ran.map((r) => r.latency));
  t.diagnostic(`${want} jobs through a hub kill and restart: the slowest ran ${worst} ms after it was added`);
  assert.ok(worst < WOKEN, `a job waited ${worst} ms: its wake was lost`);
  await stopWorkers(procs);
});

// hubPool's listener client: LISTEN through the hub, other statements on
// the pool, and a gap (the hub killed: a failover) turned into a nudge of
// every idle worker on jobs:insert and nothing on worker:migrate.
test('hubPool: the listener client, and a gap as a nudge', { skip }, async (t) => {
  const pg = require('pg');
  const { hubPool } = require('../graphile-worker');
  const h = await Hub.start(t.name);
  t.after(() => h.kill());
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
  pool.on('error', () => {});
  t.after(() => pool.end());
  const hp = hubPool(pool, { socketPath: h.socket, failover: { applicationName: 'lhgw-unit' } });
  assert.ok(hp instanceof pg.Pool, 'still a pg Pool');
  const { client, release } = await new Promise((resolve, reject) =>
    hp.connect((err, client, release) => (err ? reject(err) : resolve({ client, release }))),
  );
  t.after(() => release());
  const got = [];
  client.on('notification', (n) => got.push(n));
  await client.query('LISTEN "jobs:insert"; LISTEN "worker:migrate";');
  const r = await client.query('SELECT 41 + 1 AS x');
  assert.equal(r.rows[0].x, 42, 'another statement runs on the pool');
  const db = await DB.open();
  t.after(() => db.close());
  await db.notify('jobs:insert', '{"r":0.5,"count":1}');
  await waitFor('the insert notification', () => got.length === 1);
  assert.deepEqual(got[0], { processId: 0, channel: 'jobs:insert', payload: '{"r":0.5,"count":1}' });
  await h.kill();
  await waitFor('the gap nudge', () => got.length === 2);
  assert.deepEqual(got[1], { processId: 0, channel: 'jobs:insert', payload: JSON.stringify({ count: 1 << 30 }) });
  await db.notify('jobs:insert', '{"count":1}');
  await waitFor('a notification through the local LISTEN', () => got.length === 3);
  assert.ok(got.every((n) => n.channel === 'jobs:insert'), 'no notification on worker:migrate for the gap');
});
