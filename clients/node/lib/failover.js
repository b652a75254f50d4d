'use strict';

// Failover: the hub while it works, this process's own LISTEN connection
// after its first failure. Same rules as the Go client's client.Failover.

const frame = require('./frame');
const { connect, DEFAULT_ACK_TIMEOUT, DEFAULT_WRITE_TIMEOUT, DEFAULT_CONNECT_TIMEOUT } = require('./client');
const { Local, DEFAULT_LOCAL_APPLICATION_NAME, DEFAULT_LOCAL_TIMEOUT } = require('./local');
const { DEFAULT_MAX_PENDING, Sink, wake, status } = require('./events');
const { ClosedError, ConnError, FailoverError, InvalidNameError, SlowConsumerError } = require('./errors');

const HUB = 'hub';
const LOCAL = 'local';

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
// The swap is one-way: a Failover never goes back to the hub. A subscribe
// that meets the failure waits for the swap and is answered by the local
// listener; if the local listener cannot be built the Failover is dead with
// a FailoverError.
class Failover {
  constructor(socketPath, opts) {
    this.socketPath = socketPath;
    this._opts = opts;
    this._localOpts = {
      databaseUrl: opts.databaseUrl,
      channelPrefix: opts.channelPrefix || '',
      channelSuffix: opts.channelSuffix || '',
      applicationName: opts.applicationName || DEFAULT_LOCAL_APPLICATION_NAME,
      localTimeout: opts.localTimeout || DEFAULT_LOCAL_TIMEOUT,
      onWake: (w) => this._deliver(w),
      onStatus: (h) => {
        // Before the swap, the swap reports the local health itself.
        if (this._mode === LOCAL) this._deliver(status(h));
      },
    };
    this._sink = new Sink(opts.onWake, opts.onStatus, opts.maxPending || DEFAULT_MAX_PENDING);
    this._mode = HUB;
    this.reason = null;
    this._hub = null;
    this._local = null;
    this._subs = new Set();
    this._swap = null; // the failover's promise while it runs
    this.err = null;
    this.done = new Promise((resolve) => {
      this._resolveDone = resolve;
    });
  }

  // Options: databaseUrl (default LISTENHUB_DATABASE_URL, DATABASE_URL,
  // then pg's PG* variables), channelPrefix, channelSuffix (the hub's),
  // applicationName ("listenhub-local"), ackTimeout, writeTimeout,
  // connectTimeout (ms), localTimeout (ms, 10000), peerCheck, allowedUids,
  // onWake, onStatus, onFailover(reason), maxPending.
  static async create(socketPath, opts = {}) {
    const f = new Failover(socketPath, opts);
    let hub;
    try {
      hub = await connect(socketPath, {
        onWake: (w) => f._deliver(w),
        onStatus: (h) => f._deliver(status(h)),
        ackTimeout: opts.ackTimeout || DEFAULT_ACK_TIMEOUT,
        writeTimeout: opts.writeTimeout || DEFAULT_WRITE_TIMEOUT,
        connectTimeout: opts.connectTimeout || DEFAULT_CONNECT_TIMEOUT,
        peerCheck: opts.peerCheck,
        allowedUids: opts.allowedUids,
      });
    } catch (e) {
      if (!(e instanceof ConnError)) throw e;
      let local;
      try {
        local = await Local.create(f._localOpts);
      } catch (le) {
        throw new FailoverError(e, le);
      }
      f._mode = LOCAL;
      f.reason = e;
      f._local = local;
      f._watchLocal(local);
      f._deliver(status(local.healthy()));
      return f;
    }
    f._hub = hub;
    hub.done.then((err) => {
      if (!(err instanceof ClosedError)) f._startFailover(err);
    });
    return f;
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
    if (this.err) throw this.err;
    this._subs.add(q); // before the call: a failover meanwhile includes q
    if (this._mode === HUB && !this._swap) {
      const hub = this._hub;
      try {
        await hub.subscribe(q, opts);
        return;
      } catch (e) {
        if (e instanceof InvalidNameError) {
          this._subs.delete(q);
          throw e;
        }
        if (!hub.err) throw e; // this caller's abort; the hub client is fine
        if (hub.err instanceof ClosedError) throw this.err || e;
        this._startFailover(hub.err);
      }
    }
    if (this._swap) await this._swap;
    if (this.err) throw this.err;
    try {
      await this._local.subscribe(q);
    } catch (e) {
      if (e instanceof InvalidNameError) this._subs.delete(q);
      throw e;
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

  events() {
    return this._sink.events();
  }

  get(timeoutMs) {
    return this._sink.get(timeoutMs);
  }

  // Closes whichever listeners exist. Idempotent; safe from a callback.
  close() {
    if (this.err) return;
    this.err = new ClosedError();
    if (this._hub) this._hub.close();
    if (this._local) this._local.close();
    this._sink.end();
    this._resolveDone(this.err);
  }

  wait() {
    return this.done;
  }

  _startFailover(reason) {
    if (this.err || this._mode === LOCAL || this._swap) return;
    this._swap = this._failover(reason);
  }

  async _failover(reason) {
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
          if (e instanceof InvalidNameError) {
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
    this._swap = null;
    this._watchLocal(local);
    if (this._opts.onFailover) {
      try {
        this._opts.onFailover(reason);
      } catch (e) {
        process.emitWarning(`listenhub: onFailover threw: ${e && e.stack ? e.stack : e}`);
      }
    }
    this._deliver(status(local.healthy()));
    for (const q of recorded) this._deliver(wake(q, null));
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
    if (this._hub) this._hub.close();
    if (this._local) this._local.close();
    this._sink.end();
    this._resolveDone(err);
  }

  _deliver(ev) {
    if (this.err) return;
    const cb = this._sink.callback(ev);
    if (!cb) {
      if (!this._sink.put(ev)) {
        queueMicrotask(() => this._die(new SlowConsumerError(`listenhub: more than ${this._sink.maxPending} events not taken from events()`)));
      }
      return;
    }
    try {
      cb(ev.type === 'wake' ? ev : ev.healthy);
    } catch (e) {
      process.emitWarning(`listenhub: callback threw: ${e && e.stack ? e.stack : e}`);
    }
  }
}

module.exports = { Failover, HUB, LOCAL };
