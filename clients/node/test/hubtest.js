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

function tmpDir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

// One `listenhub serve` on its own socket. Kill it with kill() (SIGKILL:
// workers see EOF).
class Hub {
  static async start(name, { prefix = '', suffix = '', socket = '' } = {}) {
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
    h.proc = spawn(HUB_BIN, args, { env: cleanEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
    h.exited = new Promise((resolve) => h.proc.on('exit', resolve));
    const collect = (d) => {
      h.output += d.toString();
    };
    h.proc.stdout.on('data', collect);
    h.proc.stderr.on('data', collect);
    await h._ready();
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
    return this.wakes.some((w) => w.q === q && w.payload === payload && w.durable === durable);
  }

  count(q, payload, durable) {
    return this.wakes.filter((w) => w.q === q && w.payload === payload && w.durable === durable).length;
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
// about the name ("nack"), or nothing read at all ("deaf").
class FakeHub {
  static async start(mode) {
    const f = new FakeHub();
    f.dir = tmpDir('lhnode-fake-');
    f.socket = path.join(f.dir, 'fake.sock');
    f.conns = new Set();
    f.server = net.createServer((c) => {
      f.conns.add(c);
      c.on('error', () => {});
      c.on('close', () => f.conns.delete(c));
      c.write(frame.encode({ t: 'status', healthy: true }));
      if (mode === 'deaf') {
        c.pause(); // never read
        return;
      }
      const dec = new frame.Decoder();
      c.on('data', (d) => {
        dec.feed(d);
        for (let m = dec.next(); m; m = dec.next()) {
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
  }
}

module.exports = { HUB_BIN, DATABASE_URL, TIMEOUT, skip, sleep, waitFor, tmpDir, Hub, DB, Collector, FakeHub };
