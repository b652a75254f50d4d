'use strict';

// The per-process Postgres listener a Failover swaps to: its own LISTEN
// connection through the pg package (required lazily, so the hub client
// needs only node:net).

const crypto = require('node:crypto');

const frame = require('./frame');
const { Listener, wake, status } = require('./events');
const { ClosedError, InvalidNameError, ListenhubError } = require('./errors');

// Tags the local listener's backend in pg_stat_activity, distinct from the
// hub's "listenhub", so an operator sees how many processes fell back.
const DEFAULT_LOCAL_APPLICATION_NAME = 'listenhub-local';
// Bounds the connect and each LISTEN/UNLISTEN.
const DEFAULT_LOCAL_TIMEOUT = 10000;
// An idle connection is checked (SELECT 1) this often.
const HEALTH_CHECK_INTERVAL = 5000;
const BACKOFF_MIN = 100;
const BACKOFF_MAX = 5000;

// opts.databaseUrl, else LISTENHUB_DATABASE_URL, else DATABASE_URL, else
// undefined (pg then reads the PG* variables).
function databaseUrl(url) {
  return url || process.env.LISTENHUB_DATABASE_URL || process.env.DATABASE_URL || undefined;
}

// Bounds the delivery check's wait for its notification (twice the hub's
// --health-check-timeout default: a client's machine may be busy).
const DELIVERY_CHECK_TIMEOUT = 2000;

// The most likely reason notifications from another session do not arrive
// through a pooler: the advice the hub gives too.
const POOLER_ADVICE = 'a transaction-pooling PgBouncer? use a direct URL';

// Proves that notifications arrive on conn (a connected pg Client), as the
// hub's delivery check does, or rejects with a ListenhubError saying what
// it most likely looks at. LISTENs on a private channel and compares
// pg_backend_pid() with BackendKeyData's pid (conn.processID). Equal: a
// direct connection, and its own NOTIFY must come back. Different:
// something sits between that made up its own key (PgBouncer does, in every
// pool mode); through a transaction pooler our own NOTIFY comes back all
// the same, so the NOTIFY comes from a second session, which only a session
// pooler delivers. The channel is UNLISTENed afterwards. newClient(opts)
// makes the second session's client.
async function checkDelivery(conn, newClient, timeout = DELIVERY_CHECK_TIMEOUT) {
  const ch = `listenhub.check.${process.pid}.${crypto.randomBytes(4).toString('hex')}`;
  const payload = crypto.randomBytes(8).toString('hex');
  let arrived;
  const got = new Promise((resolve) => {
    arrived = resolve;
  });
  const onNote = (n) => {
    if (n.channel === ch && n.payload === payload) arrived(true);
  };
  conn.on('notification', onNote);
  const bad = (why) => new ListenhubError(`listenhub: notifications do not arrive on this connection: ${why}`);
  try {
    await conn.query('LISTEN ' + frame.quoteIdent(ch));
    const serverPid = Number((await conn.query('SELECT pg_backend_pid() AS pid')).rows[0].pid);
    const keyPid = conn.processID;
    const pooled = serverPid !== keyPid;
    if (!pooled) {
      await conn.query('SELECT pg_notify($1, $2)', [ch, payload]);
    } else {
      const other = newClient();
      try {
        await other.connect();
        await other.query('SELECT pg_notify($1, $2)', [ch, payload]);
      } catch (e) {
        throw bad(`a pooler sits between (pg_backend_pid() ${serverPid} is not BackendKeyData's ${keyPid}) and a second connection to check it failed: ${e.message}`);
      } finally {
        other.end().catch(() => {});
      }
    }
    let timer;
    const ok = await Promise.race([
      got,
      new Promise((resolve) => {
        timer = setTimeout(() => resolve(false), timeout);
      }),
    ]);
    clearTimeout(timer);
    if (!ok && pooled) {
      throw bad(`${POOLER_ADVICE} (pg_backend_pid() ${serverPid} is not BackendKeyData's ${keyPid}: a pooler sits between, and a NOTIFY from a second session did not arrive within ${timeout / 1000}s)`);
    }
    if (!ok) throw bad(`LISTEN and NOTIFY on it brought nothing back within ${timeout / 1000}s`);
    await conn.query('UNLISTEN ' + frame.quoteIdent(ch));
  } finally {
    conn.removeListener('notification', onNote);
  }
}

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new ListenhubError(`listenhub: ${what} not done within ${ms} ms`)), ms).unref();
    }),
  ]).finally(() => clearTimeout(timer));
}

// A listener over this process's own Postgres connection (session mode:
// LISTEN does not work through a transaction-pooling PgBouncer). LISTEN and
// UNLISTEN run one at a time in call order. A lost connection is
// reconnected with backoff (capped at 5 s); once every name is LISTENed
// again it reports status true and one durable wake per name (NOTIFYs in
// the gap are gone). A Local dies only by close(). Make one with
// Local.create(opts).
class Local extends Listener {
  constructor(opts) {
    super();
    this.url = databaseUrl(opts.databaseUrl);
    // A pg client config (host, user, password, ...) instead of a URL.
    this.pgConfig = opts.connectionConfig || null;
    this.prefix = opts.channelPrefix || '';
    this.suffix = opts.channelSuffix || '';
    this.applicationName = opts.applicationName || DEFAULT_LOCAL_APPLICATION_NAME;
    this.commandTimeout = opts.localTimeout || DEFAULT_LOCAL_TIMEOUT;
    this._init(opts);
    this._listening = new Set();
    this._chain = Promise.resolve(); // LISTEN/UNLISTEN in call order
    this._pendingUnlisten = new Map(); // q -> count of queued UNLISTENs
    this._healthy = false;
    this._conn = null;
    this._ending = Promise.resolve(); // the connection's end, once closed
    this._connected = null; // resolves when a connection is up (after a loss)
    this._lastTraffic = Date.now();
    this._closing = false;
  }

  static async create(opts = {}) {
    const l = new Local(opts);
    l._conn = await l._open();
    l._healthy = true;
    l._health = setInterval(() => l._check(), HEALTH_CHECK_INTERVAL);
    l._health.unref();
    return l;
  }

  channel(q) {
    return this.prefix + q + this.suffix;
  }

  // The pid of the current Postgres backend (tests, diagnostics).
  backendPid() {
    return this._conn && this._conn.processID;
  }

  // Where to connect: the pg config given, else the URL.
  _where() {
    return this.pgConfig ? { ...this.pgConfig } : { connectionString: this.url };
  }

  async _open() {
    const { Client: PgClient } = require('pg');
    const conn = new PgClient({
      ...this._where(),
      application_name: process.env.PGAPPNAME ? undefined : this.applicationName,
      connectionTimeoutMillis: this.commandTimeout,
      keepAlive: true,
      keepAliveInitialDelayMillis: 10000,
    });
    const second = () =>
      new PgClient({
        ...this._where(),
        application_name: `${this.applicationName}-check`,
        connectionTimeoutMillis: this.commandTimeout,
      });
    conn.on('notification', (n) => {
      this._lastTraffic = Date.now();
      if (conn === this._conn) this._onChannel(n.channel, n.payload);
    });
    conn.on('error', (e) => this._lost(conn, e));
    conn.on('end', () => this._lost(conn, new Error('connection ended')));
    try {
      await conn.connect();
      // Before the connection counts: notifications must provably arrive.
      await checkDelivery(conn, second, Math.min(this.commandTimeout, DELIVERY_CHECK_TIMEOUT));
    } catch (e) {
      conn.end().catch(() => {});
      throw e;
    }
    return conn;
  }

  // Resolves once Postgres confirmed the LISTEN of q's channel. Rejects
  // with InvalidNameError for a name no channel can carry, or with the
  // LISTEN's error (the Local stays alive).
  subscribe(q) {
    const problem = frame.nameProblem(q) || frame.channelProblem(this.channel(q));
    if (problem) return Promise.reject(new InvalidNameError(q, problem));
    if (this.err) return Promise.reject(this.err);
    if (this._listening.has(q) && !this._pendingUnlisten.get(q)) return Promise.resolve();
    return this._op(q, true);
  }

  // A round trip on the connection, in order after every LISTEN and
  // UNLISTEN queued before it: every notification the server sent before it
  // has been delivered when it resolves (a fail-back drains the local
  // listener so before closing it).
  sync() {
    if (this.err) return Promise.reject(this.err);
    const run = async () => {
      if (this.err) throw this.err;
      if (this._connected) await withTimeout(this._connected, this.commandTimeout, 'local round trip');
      await withTimeout(this._conn.query('SELECT 1'), this.commandTimeout, 'local round trip');
    };
    const p = this._chain.then(run);
    this._chain = p.catch(() => {});
    return p;
  }

  // Commits NOTIFY on q's channel with payload on this connection, in order
  // after the LISTENs and UNLISTENs queued before it (a fail-back's marker:
  // see Failover).
  _notify(q, payload) {
    if (this.err) return Promise.reject(this.err);
    const run = async () => {
      if (this.err) throw this.err;
      if (this._connected) await withTimeout(this._connected, this.commandTimeout, 'local NOTIFY');
      await withTimeout(this._conn.query('SELECT pg_notify($1, $2)', [this.channel(q), payload]), this.commandTimeout, 'local NOTIFY');
    };
    const p = this._chain.then(run);
    this._chain = p.catch(() => {});
    return p;
  }

  // Queues an UNLISTEN of q's channel; never blocks.
  unsubscribe(q) {
    if (this.err) return;
    this._pendingUnlisten.set(q, (this._pendingUnlisten.get(q) || 0) + 1);
    this._op(q, false).catch(() => {});
  }

  _op(q, listen) {
    const run = async () => {
      if (!listen) {
        const n = this._pendingUnlisten.get(q) - 1;
        if (n > 0) this._pendingUnlisten.set(q, n);
        else this._pendingUnlisten.delete(q);
      }
      if (this.err) throw this.err;
      if (listen === this._listening.has(q)) return;
      const sql = (listen ? 'LISTEN ' : 'UNLISTEN ') + frame.quoteIdent(this.channel(q));
      const deadline = Date.now() + this.commandTimeout;
      for (;;) {
        if (this.err) throw this.err;
        if (this._connected) {
          // Reconnecting: the reconnect re-LISTENs the set, so just wait.
          await withTimeout(this._connected, Math.max(1, deadline - Date.now()), `local ${sql}`);
          continue;
        }
        try {
          await withTimeout(this._conn.query(sql), Math.max(1, deadline - Date.now()), `local ${sql}`);
          break;
        } catch (e) {
          if (this._connected && Date.now() < deadline) continue; // lost meanwhile: after the reconnect
          throw new ListenhubError(`listenhub: local ${sql} failed: ${e.message}`);
        }
      }
      this._lastTraffic = Date.now();
      if (listen) this._listening.add(q);
      else this._listening.delete(q);
    };
    const p = this._chain.then(run);
    this._chain = p.catch(() => {});
    return p;
  }

  healthy() {
    return !this.err && this._healthy;
  }

  // Closes the connection; resolves once it has ended. Idempotent; safe
  // from a handler.
  close() {
    this._closing = true;
    this._die(new ClosedError());
    return this._ending;
  }

  _die(err) {
    if (this.err) return;
    this.err = err;
    this._healthy = false;
    clearInterval(this._health);
    if (this._conn) this._ending = this._conn.end().catch(() => {});
    this._ended(err);
  }

  // The health check of an idle connection: a round trip in the command
  // chain, never beside a LISTEN or UNLISTEN (pg runs one query at a time;
  // a second one while the first runs is queued by pg 8 with a deprecation
  // warning and refused by pg 9).
  _check() {
    if (this.err || this._connected || this._checking || Date.now() - this._lastTraffic < HEALTH_CHECK_INTERVAL) return;
    const conn = this._conn;
    this._checking = true;
    const run = async () => {
      if (this.err || this._connected || conn !== this._conn) return false;
      await withTimeout(conn.query('SELECT 1'), this.commandTimeout, 'health check');
      return true;
    };
    const p = this._chain.then(run);
    this._chain = p.catch(() => {});
    p.then(
      (ran) => {
        if (ran) this._lastTraffic = Date.now();
      },
      (e) => this._lost(conn, e),
    ).finally(() => {
      this._checking = false;
    });
  }

  _onChannel(ch, payload) {
    if (!ch.startsWith(this.prefix) || !ch.endsWith(this.suffix) || ch.length < this.prefix.length + this.suffix.length) return;
    const q = ch.slice(this.prefix.length, ch.length - this.suffix.length);
    this._deliver(wake(q, payload));
  }

  _deliver(ev) {
    if (this._closing || this.err) return;
    if (!this._handOver(ev)) this._die(this._slowConsumer());
  }

  // The connection conn was lost: reconnect, re-LISTEN, resync.
  _lost(conn, e) {
    if (this.err || conn !== this._conn || this._connected) return;
    this._healthy = false;
    let done;
    this._connected = new Promise((resolve) => {
      done = resolve;
    });
    conn.removeAllListeners('notification');
    conn.on('error', () => {});
    conn.end().catch(() => {});
    this._deliver(status(false));
    this._reconnect(done, e);
  }

  async _reconnect(done, cause) {
    let backoff = BACKOFF_MIN;
    void cause;
    while (!this.err) {
      let conn = null;
      try {
        conn = await this._open();
        for (const q of this._listening) {
          await withTimeout(conn.query('LISTEN ' + frame.quoteIdent(this.channel(q))), this.commandTimeout, 'local LISTEN');
        }
      } catch (e) {
        if (conn) {
          conn.removeAllListeners('error');
          conn.on('error', () => {});
          conn.end().catch(() => {});
        }
        await new Promise((r) => setTimeout(r, backoff).unref());
        backoff = Math.min(backoff * 2, BACKOFF_MAX);
        continue;
      }
      if (this.err) {
        conn.end().catch(() => {});
        break;
      }
      this._conn = conn;
      this._connected = null;
      this._healthy = true;
      this._lastTraffic = Date.now();
      this._deliver(status(true));
      for (const q of this._listening) this._deliver(wake(q, null));
      break;
    }
    done();
  }
}

module.exports = { Local, DEFAULT_LOCAL_APPLICATION_NAME, DEFAULT_LOCAL_TIMEOUT, DELIVERY_CHECK_TIMEOUT, checkDelivery, databaseUrl };
