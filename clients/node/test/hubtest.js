'use strict';

// Test helpers: a real `listenhub serve` per test, NOTIFY through pg, a fake
// hub for what a healthy hub never does, and waiting with deadlines.
//
// Run by clients/clients_test.go (go test ./clients/), which builds the hub
// and starts a throwaway Postgres, with LHTEST_HUB_BIN (the binary) and
// LHTEST_DATABASE_URL in the environment.

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const pg = require('pg');

const frame = require('../lib/frame');

const HUB_BIN = process.env.LHTEST_HUB_BIN || '';
const DATABASE_URL = process.env.LHTEST_DATABASE_URL || '';
// Generous: the CI machine is shared and loaded.
const TIMEOUT = 20000;

// A skip reason when the environment is missing, for test(..., {skip}).
const skip = !HUB_BIN || !DATABASE_URL ? 'LHTEST_HUB_BIN and LHTEST_DATABASE_URL are not set (run go test ./clients/)' : false;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls cond until true; throws naming what after timeout.
async function waitFor(what, cond, timeout = TIMEOUT) {
  const deadline = Date.now() + timeout;
  let interval = 1;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await sleep(interval);
    interval = Math.min(interval * 2, 20);
  }
}

function cleanEnv() {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('LISTENHUB_') || k.startsWith('PG') || k === 'DATABASE_URL') continue;
    env[k] = v;
  }
  return env;
}

// Every directory made here is removed when the test process exits (a
// killed hub's socket directory may be reused by the next hub meanwhile).
const tmpDirs = [];
process.on('exit', () => {
  for (const d of tmpDirs) fs.rmSync(d, { recursive: true, force: true });
});

function tmpDir(prefix) {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  tmpDirs.push(d);
  return d;
}

// One `listenhub serve` on its own socket. Kill it with kill() (SIGKILL:
// workers see EOF).
class Hub {
  static async start(name, { prefix = '', suffix = '', socket = '', args: extra = [], ready = true } = {}) {
    const h = new Hub();
    h.dir = tmpDir('lhnode-');
    h.socket = socket || path.join(h.dir, 'hub.sock');
    h.app = ('lhnode-' + name.replace(/[^a-zA-Z0-9]+/g, '-')).slice(0, 60);
    h.prefix = prefix;
    h.suffix = suffix;
    h.output = '';
    const args = ['serve', '--socket', h.socket, '--database-url', DATABASE_URL, '--application-name', h.app, '--status-interval', '200ms'];
    if (prefix) args.push('--channel-prefix', prefix);
    if (suffix) args.push('--channel-suffix', suffix);
    args.push(...extra);
    h.proc = spawn(HUB_BIN, args, { env: cleanEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
    h.exited = new Promise((resolve) => h.proc.on('exit', resolve));
    const collect = (d) => {
      h.output += d.toString();
    };
    h.proc.stdout.on('data', collect);
    h.proc.stderr.on('data', collect);
    if (ready) await h._ready();
    else await waitFor("the hub's socket", () => fs.existsSync(h.socket)); // a hub that refuses us
    return h;
  }

  async _ready() {
    const deadline = Date.now() + TIMEOUT;
    for (;;) {
      if (this.proc.exitCode !== null) throw new Error(`listenhub exited early (${this.proc.exitCode}):\n${this.output}`);
      if (await this._probe()) return;
      if (Date.now() > deadline) throw new Error(`listenhub not ready:\n${this.output}`);
      await sleep(10);
    }
  }

  // Connects and reads until a status healthy:true (the hub accepts before
  // its Postgres connection is up and then says false), so that tests start
  // from a hub that reports healthy on connect.
  _probe() {
    return new Promise((resolve) => {
      const s = net.createConnection({ path: this.socket });
      const dec = new frame.Decoder();
      s.setTimeout(2000, () => s.destroy());
      s.on('error', () => resolve(false));
      s.on('close', () => resolve(false));
      s.on('data', (d) => {
        dec.feed(d);
        for (let m = dec.next(); m; m = dec.next()) {
          if (m.t === 'status' && m.healthy === true) {
            s.destroy();
            resolve(true);
            return;
          }
        }
      });
    });
  }

  async kill() {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill('SIGKILL');
    await this.exited;
  }
}

// A pg connection for NOTIFY and pg_stat_activity.
class DB {
  static async open() {
    const d = new DB();
    d.conn = new pg.Client({ connectionString: DATABASE_URL, application_name: 'lhnode-test' });
    await d.conn.connect();
    return d;
  }

  notify(channel, payload = '') {
    return this.conn.query('SELECT pg_notify($1, $2)', [channel, payload]);
  }

  async backends(applicationName) {
    const r = await this.conn.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1', [applicationName]);
    return r.rows[0].n;
  }

  close() {
    return this.conn.end();
  }
}

// Records what a listener delivers through callbacks.
class Collector {
  constructor() {
    this.wakes = [];
    this.statuses = [];
    this.onWake = (w) => this.wakes.push(w);
    this.onStatus = (h) => this.statuses.push(h);
  }

  has(q, payload, durable) {
    return this.wakes.some((w) => w.name === q && w.payload === payload && w.durable === durable);
  }

  count(q, payload, durable) {
    return this.wakes.filter((w) => w.name === q && w.payload === payload && w.durable === durable).length;
  }

  async wait(what, pred) {
    try {
      await waitFor(what, () => pred(this));
    } catch (e) {
      e.message += `; wakes ${JSON.stringify(this.wakes)} statuses ${JSON.stringify(this.statuses)}`;
      throw e;
    }
  }
}

// A socket that speaks the protocol badly on purpose: a healthy status,
// then every sub answered with nothing ("silent") or with a nack that is not
// about the name ("nack"), or nothing read at all ("deaf"), half a frame and
// a stall ("partial"), an ack and a 4 MiB wake in 128-byte writes ("big");
// or every sub acked ("ack"); or the connection refused ("refuse").
class FakeHub {
  static async start(mode, dir = '') {
    const f = new FakeHub();
    f.dir = dir || tmpDir('lhnode-fake-');
    f.socket = path.join(f.dir, 'fake.sock');
    f.conns = new Set();
    f.server = net.createServer((c) => {
      f.conns.add(c);
      c.on('error', () => {});
      c.on('close', () => f.conns.delete(c));
      if (mode === 'refuse') {
        c.end(frame.encode({ t: 'nack', q: '', error: 'uid 1000 is not allowed (--allow-uid)' }));
        return;
      }
      c.write(frame.encode({ t: 'status', healthy: true }));
      if (mode === 'partial') c.write(frame.encode({ t: 'wake', q: 'a', p: 'x' }).subarray(0, 7));
      if (mode === 'deaf' || mode === 'partial') {
        c.pause(); // never read
        return;
      }
      const dec = new frame.Decoder();
      c.on('data', (d) => {
        dec.feed(d);
        for (let m = dec.next(); m; m = dec.next()) {
          if (m.t === 'sub' && (mode === 'ack' || mode === 'big')) c.write(frame.encode({ t: 'ack', q: m.q }));
          if (m.t === 'sub' && mode === 'big') bigWake(c, m.q);
          if (m.t === 'sub' && mode === 'nack') {
            c.write(frame.encode({ t: 'nack', q: m.q, error: 'LISTEN failed: listener: no connection within the command timeout' }));
          }
        }
      });
    });
    await new Promise((resolve) => f.server.listen(f.socket, resolve));
    return f;
  }

  close() {
    for (const c of this.conns) c.destroy();
    this.server.close();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

// One 4 MiB wake for q, in 128-byte writes, each after the last one left.
function bigWake(c, q) {
  const f = frame.encode({ t: 'wake', q, p: 'x'.repeat((4 << 20) - 40) });
  let i = 0;
  const step = () => {
    while (i < f.length) {
      const piece = f.subarray(i, i + 128);
      i += 128;
      if (!c.write(piece)) {
        c.once('drain', step);
        return;
      }
      if (i % (128 * 256) === 0) {
        setImmediate(step); // let the pieces go out one by one
        return;
      }
    }
  };
  step();
}

// The connects of one attack run: 1,000 in CI, 10,000 with
// LISTENHUB_TEST_LARGE_SET=1 (the size the attack was first reported at).
const attackConnects = () => (process.env.LISTENHUB_TEST_LARGE_SET ? 10000 : 1000);

// clients/testdata/attacker.py run as nobody; null (skip) without root,
// runuser or python3.
async function startAttacker(mode, shared, target, legit = '') {
  const { execFileSync } = require('node:child_process');
  if (process.getuid() !== 0) return null;
  let py;
  try {
    execFileSync('runuser', ['--help'], { stdio: 'ignore' });
    py = ['/usr/bin/python3', 'python3'].find((p) => {
      try {
        execFileSync(p, ['-c', '1'], { stdio: 'ignore' });
        return true;
      } catch {
        return false;
      }
    });
  } catch {
    return null;
  }
  if (!py) return null;
  const src = fs.readFileSync(path.join(__dirname, '..', '..', 'testdata', 'attacker.py'), 'utf8');
  const args = ['-u', 'nobody', '--', py, '-c', src, mode, shared, target];
  if (legit) args.push(legit);
  const proc = spawn('runuser', args, { stdio: ['pipe', 'pipe', 'inherit'] });
  let out = '';
  proc.stdout.on('data', (d) => {
    out += d.toString();
  });
  await waitFor('the attacker', () => out.includes('ready\n') || proc.exitCode !== null);
  if (!out.includes('ready\n')) throw new Error(`attacker did not start: ${out}`);
  return {
    async captures() {
      proc.stdin.end();
      await waitFor('the attacker to report', () => /captures \d+/.test(out));
      return Number(/captures (\d+)/.exec(out)[1]);
    },
  };
}

// A fresh root-owned directory with mode 1777, like /tmp.
function stickyDir() {
  const d = tmpDir('lhnode-sticky-');
  fs.chmodSync(d, 0o1777);
  return d;
}

module.exports = {
  HUB_BIN,
  DATABASE_URL,
  TIMEOUT,
  skip,
  sleep,
  waitFor,
  tmpDir,
  Hub,
  DB,
  Collector,
  FakeHub,
  attackConnects,
  startAttacker,
  stickyDir,
};
