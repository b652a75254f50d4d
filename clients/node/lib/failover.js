'use strict';

// Failover: the hub while it works, this process's own LISTEN connection
// while it does not, and the hub again once it is back. Same rules as the Go
// client's client.Failover.

const frame = require('./frame');
const { connect, DEFAULT_ACK_TIMEOUT, DEFAULT_WRITE_TIMEOUT, DEFAULT_CONNECT_TIMEOUT } = require('./client');
const { Local, DEFAULT_LOCAL_APPLICATION_NAME, DEFAULT_LOCAL_TIMEOUT, databaseUrl } = require('./local');
const { Listener, wake, status } = require('./events');
const { ClosedError, ConnError, FailoverError, InvalidNameError, LimitError, OtherDatabaseError } = require('./errors');

const HUB = 'hub';
const LOCAL = 'local';

// Least time on the local listener before the hub is tried again: a hub
// that keeps failing costs at most one hub -> local -> hub trip per this.
const DEFAULT_MIN_LOCAL = 5000;
// Wait after a failed fail-back attempt, doubling up to the max.
const DEFAULT_PROBE_INTERVAL = 1000;
const DEFAULT_PROBE_MAX_INTERVAL = 30000;
// Each wait between attempts is scaled by a random factor in [0.8, 1.2], so
// that the processes of a host do not all knock on a restarted hub at once.
const PROBE_JITTER = 0.2;
// Sub frames a fail-back has in flight at once.
const FAILBACK_PARALLEL = 64;

// The timers of withTimeout and within bound a wait: they never keep the
// process alive on their own (a close() meanwhile leaves the wait pending).
function withTimeout(promise, ms) {
  let timer;
  return Promise.race([promise, new Promise((_, reject) => (timer = setTimeout(() => reject(new Error('timed out')), ms).unref()))]).finally(() =>
    clearTimeout(timer),
  );
}

// Resolves with what promise resolves to, or false after ms.
function within(promise, ms) {
  let timer;
  return Promise.race([promise, new Promise((resolve) => (timer = setTimeout(() => resolve(false), ms).unref()))]).finally(() =>
    clearTimeout(timer),
  );
}

// Whether hub client c reported healthy within its ack timeout (false once
// it is dead).
const healthyInTime = (c) => within(Promise.race([c._lh.healthy, c.done.then(() => false)]), c.ackTimeout);

const jitter = (ms) => ms * (1 - PROBE_JITTER + 2 * PROBE_JITTER * Math.random());

// A listener that uses the hub while it can and its own Postgres connection
// after that. Make one with Failover.create(socketPath, opts).
//
// It records the subscription set. On the hub client's first failure —
// connect refused or socket missing (at start: local mode from the start),
// ack timeout, a nack other than an invalid name, EOF (hub gone, or this
// process evicted), a stalled write — it opens a Local listener (pg),
// LISTENs the recorded set (channel = prefix + q + suffix, quoted
// identifiers), swaps it in, and then delivers one durable wake per
// recorded name: NOTIFYs committed between the hub's failure and the local
// LISTENs are gone, durable readers re-read; an ephemeral payload sent in
// that gap is lost (as in a hub reconnect to Postgres).
//
// Fail-back (unless oneWay): in local mode it tries the hub again, minLocal
// after the swap, then with backoff (probeInterval doubling to
// probeMaxInterval, with jitter). An attempt connects a second hub client,
// waits (up to the ack timeout) for it to report healthy, subscribes the
// whole recorded set and waits for every ack, while the local listener
// keeps delivering; only then does it swap the hub in and close the local
// listener (make before break: a NOTIFY in the overlap may be delivered
// twice, none is lost; a round trip on the local connection after the last
// ack lets a NOTIFY committed just before the hub's LISTEN, which only the
// local listener gets, arrive before it is closed), call onFailback() and
// deliver one durable wake per
// recorded name. A failed attempt is abandoned and retried later; back on
// the hub, the cycle can repeat. oneWay keeps pgbus's rule: once local,
// local until close(). During a fail-back both listeners deliver wakes;
// statuses come from the current one only.
//
// A subscribe that meets the failure waits for the swap and is answered by
// the local listener; if the local listener cannot be built the Failover is
// dead with a FailoverError.
class Failover extends Listener {
  constructor(socketPath, opts) {
    super();
    this.socketPath = socketPath;
    this._opts = opts;
    this._localOpts = {
      databaseUrl: opts.databaseUrl,
      connectionConfig: opts.connectionConfig,
      channelPrefix: opts.channelPrefix || '',
      channelSuffix: opts.channelSuffix || '',
      applicationName: opts.applicationName || DEFAULT_LOCAL_APPLICATION_NAME,
      localTimeout: opts.localTimeout || DEFAULT_LOCAL_TIMEOUT,
      onWake: (w) => this._localWake(w),
      onStatus: (h) => {
        // Before the swap, the swap reports the local health itself.
        if (this._mode === LOCAL) this._deliver(status(h));
      },
    };
    this._init(opts);
    if (opts.onFailover) this.on('failover', opts.onFailover);
    if (opts.onFailback) this.on('failback', opts.onFailback);
    this._mode = HUB;
    this.reason = null;
    this._hub = null;
    this._local = null;
    this._subs = new Set();
    this._swap = null; // the failover's promise while it runs
    this._cand = null; // a fail-back's hub client until swapped in or given up
    this._failbackTimer = null;
    this._cut = null; // a fail-back's switch point (see _hubWake)
    this._wrongDatabase = false;
    this._probe = null; // the start's database check (see _checkDatabase)
  }

  // Options: databaseUrl (default LISTENHUB_DATABASE_URL, DATABASE_URL,
  // then pg's PG* variables) or connectionConfig (a pg client config, which
  // wins), channelPrefix, channelSuffix (the hub's),
  // applicationName ("listenhub-local"), ackTimeout, writeTimeout,
  // connectTimeout (ms), silenceTimeout (ms, 15000), localTimeout (ms, 10000),
  // peerCheck, allowedUids,
  // oneWay (false), minLocal (ms, 5000), probeInterval (ms, 1000),
  // probeMaxInterval (ms, 30000), onWake, onStatus, onFailover(reason),
  // onFailback(), maxPending.
  static async create(socketPath, opts = {}) {
    const f = new Failover(socketPath, opts);
    try {
      const hub = await f._newHub(true);
      try {
        await f._checkDatabase(hub);
      } catch (e) {
        hub.close();
        throw e;
      }
      f._hub = hub;
      if (hub._lh.unverified) f._verifyLater(hub).catch(() => {});
    } catch (e) {
      if (!(e instanceof ConnError) && !(e instanceof OtherDatabaseError)) throw e;
      let local;
      try {
        local = await Local.create(f._localOpts);
      } catch (le) {
        throw new FailoverError(e, le);
      }
      // Never silent: the process's stderr (or its 'warning' listeners)
      // says why this worker holds a connection of its own.
      process.emitWarning(
        e instanceof OtherDatabaseError ? e.message : `listenhub: hub unreachable (${e.message}), listening locally`,
        'ListenhubWarning',
      );
      f._mode = LOCAL;
      f.reason = e;
      f._local = local;
      f._deliver(status(local.healthy()));
      f._startLocal(local);
    }
    return f;
  }

  // At start: the hub must hear the database this listener was given. A
  // private name is subscribed through it, a NOTIFY of it committed on a
  // short connection of this process's own, and it must come back through
  // the hub within the ack timeout; if not, OtherDatabaseError. A hub not
  // healthy within the ack timeout (its Postgres is down) is not trusted
  // either: it is left unverified, its wakes held, until _verifyLater has
  // checked it once it says healthy. Whatever else keeps the check from
  // running (a database not reachable, no room for the name) leaves the
  // hub trusted.
  async _checkDatabase(hub) {
    if (!this._cutFits() || hub.err) return;
    if (!(await healthyInTime(hub))) {
      if (!hub.err) {
        hub._lh.unverified = true;
        hub._lh.held = [];
      }
      return;
    }
    await this._probeDatabase(hub);
  }

  // The start's check, once the hub first says healthy: verified, the held
  // wakes are delivered; a hub on another database is left for a local
  // listener (reason OtherDatabaseError), its held wakes, another
  // database's, dropped.
  async _verifyLater(hub) {
    const ok = await Promise.race([hub._lh.healthy, hub.done.then(() => false)]);
    if (!ok || this.err) return this._releaseHeld(hub, false);
    try {
      await this._probeDatabase(hub);
    } catch (e) {
      if (!(e instanceof OtherDatabaseError)) return this._releaseHeld(hub, true); // the check could not run
      process.emitWarning(e.message, 'ListenhubWarning');
      this._releaseHeld(hub, false);
      hub.close();
      this._startFailover(hub, e);
      return;
    }
    this._releaseHeld(hub, true);
  }

  _releaseHeld(hub, deliver) {
    const held = hub._lh.held || [];
    hub._lh.unverified = false;
    hub._lh.held = [];
    if (deliver && hub._lh.current) for (const w of held) this._deliver(w);
  }

  // The check itself (see _checkDatabase).
  async _probeDatabase(hub) {
    const ms = hub.ackTimeout;
    const token = require('node:crypto').randomBytes(8).toString('hex');
    const probe = { hub, q: 'lh.db.' + token.slice(0, 8), token };
    probe.came = new Promise((resolve) => (probe.arrived = resolve));
    this._probe = probe;
    try {
      try {
        await hub.subscribe(probe.q);
      } catch (e) {
        return; // the hub's own failure shows elsewhere
      }
      const { Client: PgClient } = require('pg');
      const o = this._localOpts;
      const conn = new PgClient({
        ...(o.connectionConfig || { connectionString: databaseUrl(o.databaseUrl) }),
        application_name: `${o.applicationName}-check`,
        connectionTimeoutMillis: ms,
      });
      conn.on('error', () => {});
      let database;
      try {
        await conn.connect();
        const r = await conn.query('SELECT current_database() AS db, pg_notify($1, $2)', [o.channelPrefix + probe.q + o.channelSuffix, probe.token]);
        database = `${r.rows[0].db} at ${conn.host}:${conn.port}`;
      } catch (e) {
        return;
      } finally {
        conn.end().catch(() => {});
      }
      if (!(await within(probe.came, ms))) throw new OtherDatabaseError(this.socketPath, database, ms);
    } finally {
      this._probe = null;
      if (!hub.err) hub.unsubscribe(probe.q);
    }
  }

  // A hub client whose statuses are delivered only while it is the current
  // one; c._lh.healthy resolves at its first healthy status.
  async _newHub(current) {
    const state = { current };
    state.healthy = new Promise((resolve) => {
      state.resolveHealthy = resolve;
    });
    const opts = this._opts;
    const holder = [];
    const c = await connect(this.socketPath, {
      onWake: (w) => this._hubWake(holder[0], state, w),
      onStatus: (h) => {
        if (h) state.resolveHealthy(true);
        if (state.current) this._deliver(status(h));
      },
      ackTimeout: opts.ackTimeout || DEFAULT_ACK_TIMEOUT,
      writeTimeout: opts.writeTimeout || DEFAULT_WRITE_TIMEOUT,
      connectTimeout: opts.connectTimeout || DEFAULT_CONNECT_TIMEOUT,
      silenceTimeout: opts.silenceTimeout,
      peerCheck: opts.peerCheck,
      allowedUids: opts.allowedUids,
    });
    c._lh = state;
    holder.push(c);
    c.done.then((err) => {
      if (!(err instanceof ClosedError)) this._startFailover(c, err);
    });
    return c;
  }

  // "hub" or "local": where wakes come from now.
  mode() {
    return this._mode;
  }

  // Records q and subscribes the current listener. In hub mode a hub
  // failure (anything but an invalid name or this caller's abort) triggers
  // the failover and the subscription is made locally.
  async subscribe(q, opts = {}) {
    const problem = frame.nameProblem(q);
    if (problem) throw new InvalidNameError(q, problem);
    for (;;) {
      if (this.err) throw this.err;
      this._subs.add(q); // before the call: a swap meanwhile includes q
      if (this._swap) {
        await this._swap;
        continue;
      }
      const cur = this._mode === HUB ? this._hub : this._local;
      try {
        await (this._mode === HUB ? cur.subscribe(q, opts) : cur.subscribe(q));
        return;
      } catch (e) {
        if (e instanceof InvalidNameError || e instanceof LimitError) {
          this._subs.delete(q);
          throw e;
        }
        if (cur === this._hub && cur.err && !(cur.err instanceof ClosedError)) {
          this._startFailover(cur, cur.err);
          continue;
        }
        if (!this.err && cur.err instanceof ClosedError && cur !== this._hub && cur !== this._local) {
          continue; // replaced by a swap meanwhile: subscribe the new one
        }
        if (cur.err || this.err) throw this.err || e;
        throw e; // this caller's abort, or a local LISTEN that failed; the listener lives
      }
    }
  }

  // Drops q from the recorded set and the current listener. Never blocks.
  unsubscribe(q) {
    this._subs.delete(q);
    if (this.err || this._swap) return;
    (this._mode === HUB ? this._hub : this._local).unsubscribe(q);
  }

  healthy() {
    if (this.err || this._swap) return false;
    return (this._mode === HUB ? this._hub : this._local).healthy();
  }

  // The recorded set.
  subscriptions() {
    return new Set(this._subs);
  }

  // Closes whichever listeners exist; resolves once they are closed.
  // Idempotent; safe from a handler.
  close() {
    if (this.err) return this._closed || Promise.resolve();
    this.err = new ClosedError();
    const closing = [];
    for (const x of [this._hub, this._local, this._cand]) if (x) closing.push(x.close());
    this._closed = Promise.all(closing).then(() => {});
    clearTimeout(this._failbackTimer);
    this._ended(this.err);
    return this._closed;
  }

  _startFailover(hub, reason) {
    if (this.err || this._mode !== HUB || this._hub !== hub || this._swap) return;
    this._swap = this._failover(reason);
  }

  async _failover(reason) {
    process.emitWarning(`listenhub: hub failed (${reason && reason.message}), failing over to a local listener`, 'ListenhubWarning');
    this._deliver(status(false));
    let local;
    try {
      local = await Local.create(this._localOpts);
    } catch (e) {
      this._swap = null;
      this._die(new FailoverError(reason, e));
      return;
    }
    const listened = new Set();
    for (;;) {
      if (this.err) {
        local.close();
        this._swap = null;
        return;
      }
      const todo = [...this._subs].filter((q) => !listened.has(q)).sort();
      if (todo.length === 0) break;
      for (const q of todo) {
        try {
          await local.subscribe(q);
        } catch (e) {
          if (e instanceof InvalidNameError || e instanceof LimitError) {
            this._subs.delete(q);
            continue;
          }
          local.close();
          this._swap = null;
          this._die(new FailoverError(reason, e));
          return;
        }
        listened.add(q);
      }
    }
    for (const q of listened) if (!this._subs.has(q)) local.unsubscribe(q);
    const recorded = [...this._subs].sort();
    this._mode = LOCAL;
    this.reason = reason;
    this._local = local;
    this._hub = null;
    this._swap = null;
    this._emit('failover', reason);
    this._deliver(status(local.healthy()));
    for (const q of recorded) this._deliver(wake(q, null));
    this._startLocal(local);
  }

  // local is current: watch it, and try the hub again.
  _startLocal(local) {
    this._watchLocal(local);
    if (this._opts.oneWay) return;
    const o = this._opts;
    let wait = o.minLocal ?? DEFAULT_MIN_LOCAL;
    let next = o.probeInterval || DEFAULT_PROBE_INTERVAL;
    const top = Math.max(o.probeMaxInterval || DEFAULT_PROBE_MAX_INTERVAL, next);
    let attempt = 0;
    const schedule = () => {
      // Not once closed: an attempt that close() cut short returns false,
      // and a timer set then would keep the process alive for the wait.
      if (this.err) return;
      this._failbackTimer = setTimeout(async () => {
        attempt++;
        if (await this._failback(local, attempt)) return;
        wait = jitter(next);
        next = Math.min(2 * next, top);
        schedule();
      }, wait);
    };
    schedule();
  }

  // The cut of a fail-back. Both listeners receive one Postgres's
  // notifications in commit order, so a marker NOTIFY committed on the local
  // connection while both listen is at the same place in both streams: the
  // local listener's wakes are delivered up to it and the hub's after it
  // (held until the local listener has passed it): none twice, none lost.
  // A marker the hub never delivers means a hub on another database, and
  // the fail-back is refused.
  _cutFits() {
    const o = this._localOpts;
    return Buffer.byteLength(o.channelPrefix) + 'lh.cut.'.length + 8 + Buffer.byteLength(o.channelSuffix) <= 63;
  }

  _hubWake(c, state, w) {
    const probe = this._probe;
    if (probe && c && probe.hub === c && w.name === probe.q) {
      if (w.payload === probe.token) probe.arrived(true);
      return;
    }
    if (state.unverified) {
      state.held.push(w); // _verifyLater delivers or drops them
      return;
    }
    const cut = this._cut;
    if (cut && c && cut.hub === c) {
      if (w.name === cut.q) {
        if (w.payload === cut.token && !cut.hubPast) {
          cut.hubPast = true;
          cut.held = []; // the hub delivers them from here on
          cut.passed();
        }
        return;
      }
      if (!cut.hubPast) return; // before the marker: the local listener delivers it
      if (!cut.localPast) {
        cut.buf.push(w);
        return;
      }
    } else if (!state.current) {
      return; // a candidate given up: the local listener delivered it
    }
    this._deliver(w);
  }

  _localWake(w) {
    const cut = this._cut;
    if (cut) {
      if (w.name === cut.q) {
        if (w.payload === cut.token && !cut.localPast) {
          cut.localPast = true;
          for (const b of cut.buf) this._deliver(b);
          cut.buf = [];
          cut.passed();
        }
        return;
      }
      if (cut.localPast && !cut.hubPast) {
        cut.held.push(w); // the hub's, once it passes; ours if it never does
        return;
      }
      if (cut.localPast) return; // after the marker: the hub delivers it
    }
    this._deliver(w);
  }

  // _abandon removes the cut of a fail-back given up and makes up for what
  // it held back: the local listener's wakes after its marker when the hub
  // never passed its own (a hub on another database), in order, before any
  // later one; when both had passed, a durable wake per name (the wakes in
  // flight as the hub stopped delivering may have reached neither side).
  _abandon(cut) {
    if (this._cut !== cut) return;
    this._cut = null;
    if (cut.localPast && !cut.hubPast) {
      for (const w of cut.held) this._deliver(w);
    } else if (cut.localPast && cut.hubPast) {
      for (const q of [...this._subs].sort()) this._deliver(wake(q, null));
    }
    cut.held = [];
  }

  // Commits the marker and waits until both listeners delivered it; null
  // when they did, else why not.
  async _sendMarker(local, cut, ms) {
    try {
      await local._notify(cut.q, cut.token);
    } catch (e) {
      return e.message;
    }
    if (await within(cut.both, ms)) return null;
    if (cut.hubPast) return 'the local listener did not deliver the fail-back marker in time';
    const msg =
      `listenhub: the hub at ${this.socketPath} does not deliver this database's notifications (a marker did not ` +
      `come back through it within ${ms} ms): it serves another database or cluster; staying on the local listener`;
    if (!this._wrongDatabase) {
      this._wrongDatabase = true;
      process.emitWarning(msg);
    }
    return msg;
  }

  // One attempt to return to the hub; true means stop trying (back on the
  // hub, local no longer current, or dead).
  async _failback(local, attempt) {
    if (this.err || this._swap || this._mode !== LOCAL || this._local !== local) return true;
    let cand;
    try {
      cand = await this._newHub(false);
    } catch (e) {
      void attempt;
      return false;
    }
    if (this.err) {
      cand.close();
      return true;
    }
    this._cand = cand;
    let swapped = false;
    let recorded;
    let cut = null;
    try {
      if (!(await healthyInTime(cand)) || cand.err) return false;
      if (this._cutFits()) {
        cut = newCut(cand);
        this._cut = cut;
        try {
          await withTimeout(local.subscribe(cut.q), cand.ackTimeout);
          await cand.subscribe(cut.q);
        } catch (e) {
          return false;
        }
      }
      let markedAt = -1;
      const acked = new Set();
      let drained = false;
      for (;;) {
        if (this.err) return true;
        const todo = [...this._subs].filter((q) => !acked.has(q)).sort();
        if (todo.length === 0 && !drained) {
          // A NOTIFY committed just before the hub's LISTEN of its name
          // reaches only the local listener: let it arrive before closing.
          await withTimeout(local.sync(), cand.ackTimeout).catch(() => {});
          drained = true;
          continue; // names subscribed meanwhile need their acks first
        }
        if (todo.length === 0 && cut && markedAt < 0) {
          if ((await this._sendMarker(local, cut, cand.ackTimeout)) !== null) return false;
          markedAt = acked.size;
          continue;
        }
        if (todo.length === 0) {
          if (!cand.healthy()) return false;
          if (cut && acked.size !== markedAt) return false; // a name acked after the marker: start again
          for (const q of acked) if (!this._subs.has(q)) cand.unsubscribe(q);
          recorded = [...this._subs].sort();
          this._mode = HUB;
          this.reason = null;
          this._hub = cand;
          this._local = null;
          this._cand = null;
          cand._lh.current = true;
          swapped = true;
          break;
        }
        const err = await this._subscribeAll(cand, todo, acked);
        if (err) return false;
        drained = false;
      }
    } finally {
      if (!swapped) {
        if (this._cand === cand) this._cand = null;
        cand.close();
        if (cut) {
          this._abandon(cut);
          local.unsubscribe(cut.q);
        }
      }
    }
    local.close(); // break, after make
    if (cut) {
      this._cut = null;
      cand.unsubscribe(cut.q);
    }
    this._emit('failback');
    this._deliver(status(cand.healthy()));
    for (const q of recorded) this._deliver(wake(q, null));
    return true;
  }

  // Subscribes c to todo, FAILBACK_PARALLEL at a time; the acked names join
  // acked, invalid ones are forgotten; the first other error is returned.
  async _subscribeAll(c, todo, acked) {
    let first = null;
    let i = 0;
    const worker = async () => {
      while (i < todo.length && !first) {
        const q = todo[i++];
        try {
          await c.subscribe(q);
          acked.add(q);
        } catch (e) {
          if (e instanceof InvalidNameError || e instanceof LimitError) this._subs.delete(q);
          else first = first || e;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(FAILBACK_PARALLEL, todo.length) }, worker));
    return first;
  }

  // Emits 'failover' or 'failback' while alive; a throwing listener is a
  // warning.
  _emit(event, ...args) {
    if (this.err) return;
    try {
      this.emit(event, ...args);
    } catch (e) {
      process.emitWarning(`listenhub: callback threw: ${e && e.stack ? e.stack : e}`);
    }
  }

  _watchLocal(local) {
    local.done.then((err) => {
      if (!(err instanceof ClosedError)) this._die(new FailoverError(this.reason, err));
    });
  }

  _die(err) {
    if (this.err) return;
    this._deliver(status(false));
    this.err = err;
    clearTimeout(this._failbackTimer);
    for (const x of [this._hub, this._local, this._cand]) if (x) x.close();
    this._ended(err);
  }

  _deliver(ev) {
    if (this.err) return;
    if (!this._handOver(ev)) queueMicrotask(() => this._die(this._slowConsumer()));
  }
}

// newCut makes the cut of a fail-back to hub client c: a private name and a
// random payload (the marker).
function newCut(c) {
  const token = require('node:crypto').randomBytes(8).toString('hex');
  const cut = { hub: c, q: 'lh.cut.' + token.slice(0, 8), token, hubPast: false, localPast: false, buf: [], held: [] };
  cut.both = new Promise((resolve) => {
    cut.passed = () => {
      if (cut.hubPast && cut.localPast) resolve(true);
    };
  });
  return cut;
}

module.exports = { Failover, HUB, LOCAL, DEFAULT_MIN_LOCAL, DEFAULT_PROBE_INTERVAL, DEFAULT_PROBE_MAX_INTERVAL };
