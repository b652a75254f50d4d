'use strict';

// The client's side of "never silently wrong". Socket identity (the
// symlink-flipping attack), the hub's refusal, stalled and large frames,
// the UTF-8 nack, the local listener's delivery check.

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const listenhub = require('..');
const frame = require('../lib/frame');
const { DATABASE_URL, TIMEOUT, skip, tmpDir, Hub, FakeHub, attackConnects, startAttacker, stickyDir } = require('./hubtest');
const local = require('../lib/local');

function dir(t, mode = 0o700) {
  const d = tmpDir('lhnode-id-');
  fs.chmodSync(d, mode);
  t.after(() => fs.rmSync(d, { recursive: true, force: true }));
  return d;
}

async function fake(t, mode, d = '') {
  const h = await FakeHub.start(mode, d);
  t.after(() => h.close());
  return h;
}

async function refused(p, want, opts = {}) {
  await assert.rejects(listenhub.connect(p, opts), (e) => {
    assert.ok(e instanceof listenhub.ConnError, String(e));
    assert.equal(e.op, 'peer', String(e));
    assert.match(e.message, want);
    return true;
  });
}

test('identity: a symlink to a real socket is refused', async (t) => {
  const h = await fake(t, 'ack');
  const link = path.join(dir(t), 'hub.sock');
  fs.symlinkSync(h.socket, link);
  await refused(link, /a symlink/);
  (await listenhub.connect(h.socket)).close(); // the socket itself is fine
});

test('a missing socket directory: the error says install -d', async (t) => {
  const p = path.join(dir(t), 'missing', 'hub.sock');
  await assert.rejects(listenhub.connect(p), (e) => e instanceof listenhub.ConnError && e.op === 'dial' && e.message.includes('install -d -m 0755 ' + path.dirname(p)));
});

test('identity: a file is not a socket', async (t) => {
  const p = path.join(dir(t), 'hub.sock');
  fs.writeFileSync(p, '');
  await refused(p, /not a socket/);
});

test('identity: a directory writable by group or other is refused', async (t) => {
  for (const mode of [0o770, 0o707]) {
    const d = dir(t);
    const h = await fake(t, 'ack', d);
    fs.chmodSync(d, mode);
    await refused(h.socket, /writable by group or other/);
  }
});

test('identity: a directory above the socket writable by others is refused', async (t) => {
  // Every directory up to / counts: one above the socket's that another
  // user can write to lets them swap the socket's directory.
  const top = dir(t);
  const d = path.join(top, 'run');
  fs.mkdirSync(d, 0o700);
  const h = await fake(t, 'ack', d);
  fs.chmodSync(top, 0o777);
  await refused(h.socket, new RegExp(`${top} above the socket: directory mode 0777 is writable by group or other`));
  await refused(h.socket, new RegExp(`chmod go-w ${top}`));
});

test('identity: an unreachable directory names the permission', async (t) => {
  // A uid that may not search the way to the socket gets the fix, not a
  // bare "permission denied" (run as nobody: root may search anything).
  const { spawnSync } = require('node:child_process');
  if (process.getuid() !== 0 || spawnSync('runuser', ['--help']).error) {
    t.skip('needs root and runuser to run a client as nobody');
    return;
  }
  const top = dir(t); // 0700, root's
  const sock = path.join(top, 'run', 'hub.sock');
  const code = `require(${JSON.stringify(path.join(__dirname, '..'))}).connect(${JSON.stringify(sock)}).catch((e) => console.log(e.message));`;
  const r = spawnSync('runuser', ['-u', 'nobody', '--', process.execPath, '-e', code], { encoding: 'utf8', timeout: 30000 });
  assert.match(r.stdout, /may not reach the socket/, r.stderr);
  assert.match(r.stdout, /search \(x\) permission/);
});

test('identity: a sticky directory (like /tmp) is accepted', async (t) => {
  const d = stickyDir();
  t.after(() => fs.rmSync(d, { recursive: true, force: true }));
  const h = await fake(t, 'ack', d);
  const c = await listenhub.connect(h.socket);
  await c.subscribe('a');
  c.close();
});

test('identity: a directory of another owner is refused unless allowed', { skip: process.getuid() !== 0 && 'needs root to chown' }, async (t) => {
  const d = dir(t);
  const h = await fake(t, 'ack', d);
  fs.chownSync(d, 65534, 0);
  await refused(h.socket, /directory owned by uid 65534/);
  (await listenhub.connect(h.socket, { allowedUids: [65534] })).close();
});

async function attack(t, mode) {
  const shared = stickyDir();
  t.after(() => fs.rmSync(shared, { recursive: true, force: true }));
  let legit = '';
  let target;
  if (mode === 'final') {
    target = path.join(shared, 'fake.sock');
  } else {
    legit = dir(t);
    await fake(t, 'ack', legit); // the real hub: fake.sock in a trusted directory
    target = path.join(shared, 'link', 'fake.sock');
  }
  const atk = await startAttacker(mode, shared, target, legit);
  if (!atk) {
    t.skip('the attack needs root, runuser and python3 (a foreign uid flips the path)');
    return null;
  }
  const n = attackConnects();
  let ok = 0;
  let refusedN = 0;
  try {
    for (let i = 0; i < n; i++) {
      let c;
      try {
        c = await listenhub.connect(target, { connectTimeout: 1000, ackTimeout: 1000 });
      } catch (e) {
        if (!(e instanceof listenhub.ConnError)) throw e;
        refusedN++;
        continue;
      }
      try {
        await c.subscribe('probe');
        ok++;
      } catch {
        refusedN++;
      } finally {
        c.close();
      }
    }
  } finally {
    const captures = await atk.captures();
    t.diagnostic(`attack ${mode}: ${n} connects, ${captures} captures, ${ok} reached the real hub, ${refusedN} refused`);
    assert.equal(captures, 0, `the attacker captured ${captures} of ${n} connects`);
  }
  return { ok, refused: refusedN };
}

test('identity: the attack flipping the socket path captures nothing', async (t) => {
  const r = await attack(t, 'final');
  if (r) assert.equal(r.ok, 0);
});

test('identity: the attack flipping the directory captures nothing', async (t) => {
  const r = await attack(t, 'dir');
  if (r) {
    assert.ok(r.ok > 0, 'never reached the real hub: the test did not test');
    assert.ok(r.refused > 0, 'never refused: the flipping did not happen');
  }
});

test('refusal: the hub tells a refused uid why', { skip }, async (t) => {
  const hub = await Hub.start('refused', { args: ['--allow-uid', '54321'], ready: false });
  t.after(() => hub.kill());
  const c = await listenhub.connect(hub.socket);
  t.after(() => c.close());
  await assert.rejects(c.subscribe('a'), (e) => {
    assert.ok(e instanceof listenhub.RefusedError, String(e));
    assert.match(e.message, new RegExp(`uid ${process.getuid()} is not allowed`));
    return true;
  });
  assert.ok(c.err instanceof listenhub.RefusedError);
});

test('refusal: a nack before any status is the refusal', async (t) => {
  const h = await fake(t, 'refuse');
  const c = await listenhub.connect(h.socket);
  const err = await c.wait();
  assert.ok(err instanceof listenhub.RefusedError, String(err));
  assert.match(err.message, /uid 1000 is not allowed/);
});

test('utf8: the nack for a name that is not UTF-8 matches the sub (q64)', { skip }, async (t) => {
  const hub = await Hub.start('utf8nack');
  t.after(() => hub.kill());
  const c = await listenhub.connect(hub.socket);
  t.after(() => c.close());
  const q = 'a\ud83d'; // a lone surrogate: the client refuses it itself ...
  await assert.rejects(c.subscribe(q), listenhub.InvalidNameError);
  // ... so let it through to the hub, which nacks it with the name as sent
  // ("q64"): the client matches it to its sub and lives. Before q64 the
  // nack named "a\ufffd", matched nothing, and the subscribe ran into its
  // ack timeout (AckTimeoutError), which killed the client.
  const orig = frame.nameProblem;
  frame.nameProblem = () => null;
  try {
    await assert.rejects(c.subscribe(q), (e) => {
      assert.ok(e instanceof listenhub.InvalidNameError, String(e));
      assert.match(e.message, /not valid UTF-8/);
      return true;
    });
  } finally {
    frame.nameProblem = orig;
  }
  assert.equal(c.err, null);
  await c.subscribe('fine');
});

test('frames: a stalled partial frame times out', async (t) => {
  const h = await fake(t, 'partial');
  const t0 = Date.now();
  const c = await listenhub.connect(h.socket, { frameTimeout: 300 });
  const err = await c.wait();
  assert.ok(err instanceof listenhub.ConnError, String(err));
  assert.match(err.message, /frame timeout/);
  assert.ok(Date.now() - t0 >= 250);
  assert.equal(require('../lib/client').DEFAULT_FRAME_TIMEOUT, 10000);
});

test('frames: a 4 MiB frame in 128-byte writes arrives', async (t) => {
  const h = await fake(t, 'big');
  const c = await listenhub.connect(h.socket, { ackTimeout: TIMEOUT });
  t.after(() => c.close());
  await c.subscribe('big');
  for (;;) {
    const ev = await c.get(TIMEOUT);
    assert.ok(ev, 'no 4 MiB wake');
    if (ev.type === 'wake') {
      assert.equal(ev.payload.length, (4 << 20) - 40);
      break;
    }
  }
});

test('frames: reassembly is linear', () => {
  const f = frame.encode({ t: 'wake', q: 'big', p: 'x'.repeat((4 << 20) - 40) });
  const dec = new frame.Decoder();
  const t0 = process.cpuUsage();
  let got = null;
  for (let i = 0; i < f.length; i += 128) {
    dec.feed(f.subarray(i, i + 128));
    got = dec.next() || got;
  }
  const u = process.cpuUsage(t0);
  const cpu = (u.user + u.system) / 1e6;
  assert.ok(got);
  // Linear: about 0.1 s here; the quadratic one took 8.9 s.
  assert.ok(cpu < 3, `4 MiB in 128-byte pieces took ${cpu.toFixed(2)} s of CPU`);
});

// The local listener proves that notifications arrive before it counts as
// connected: through a transaction-pooling PgBouncer they do not.
const TXN_URL = process.env.LHTEST_PGBOUNCER_TRANSACTION_URL || '';
const SESSION_URL = process.env.LHTEST_PGBOUNCER_SESSION_URL || '';
const noBouncer = skip || (!TXN_URL && 'no PgBouncer (LHTEST_PGBOUNCER_*_URL; go test ./clients/ starts them)');

test('delivery: a direct connection passes', { skip }, async (t) => {
  const l = await listenhub.Local.create({ databaseUrl: DATABASE_URL });
  t.after(() => l.close());
  assert.ok(l.healthy());
});

test('delivery: a transaction pooler is refused', { skip: noBouncer }, async () => {
  // Before the check the listener "worked": its LISTEN was acked, and it
  // received nothing.
  await assert.rejects(listenhub.Local.create({ databaseUrl: TXN_URL }), (e) => {
    assert.ok(e instanceof listenhub.ListenhubError, String(e));
    assert.match(e.message, /^listenhub: notifications do not arrive on this connection: a transaction-pooling PgBouncer\? use a direct URL/);
    assert.match(e.message, /is not BackendKeyData's/);
    return true;
  });
});

test('delivery: a session pooler delivers', { skip: noBouncer }, async (t) => {
  const got = [];
  const l = await listenhub.Local.create({ databaseUrl: SESSION_URL, onWake: (w) => got.push(w) });
  t.after(() => l.close());
  await l.subscribe('pooled');
  const { Client } = require('pg');
  const other = new Client({ connectionString: DATABASE_URL });
  await other.connect();
  try {
    await other.query("NOTIFY pooled, 'x'");
  } finally {
    await other.end();
  }
  const deadline = Date.now() + TIMEOUT;
  while (!got.some((w) => w.name === 'pooled' && w.payload === 'x')) {
    assert.ok(Date.now() < deadline, 'no wake through the session pooler');
    await new Promise((r) => setTimeout(r, 10));
  }
});

test('delivery: a pid mismatch without the notification fails', { skip }, async (t) => {
  // A fake of the pooler's tell: BackendKeyData's pid is not
  // pg_backend_pid(), and the second session's NOTIFY goes nowhere.
  const { Client } = require('pg');
  const conn = new Client({ connectionString: DATABASE_URL });
  await conn.connect();
  t.after(() => conn.end());
  Object.defineProperty(conn, 'processID', { value: 1 });
  const nowhere = () => ({ connect: async () => {}, query: async () => {}, end: async () => {} });
  await assert.rejects(local.checkDelivery(conn, nowhere, 300), /a transaction-pooling PgBouncer\? use a direct URL/);
});
