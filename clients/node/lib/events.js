'use strict';

// What listeners deliver, and the sink that hands it to callbacks or to an
// async iterator.

const { EventEmitter } = require('node:events');
const { ClosedError, SlowConsumerError } = require('./errors');

const DEFAULT_MAX_PENDING = 65536;

// A wake: name is the subscription name; payload is null and durable true
// for a NOTIFY without payload ("something changed, re-read": may be
// coalesced and synthesized after a gap), otherwise the payload may be the
// only copy.
function wake(name, p) {
  if (p === null || p === undefined || p === '') return { type: 'wake', name, payload: null, durable: true };
  return { type: 'wake', name, payload: p, durable: false };
}

// The hub's (or the local listener's) Postgres connection is (not) healthy.
function status(healthy) {
  return { type: 'status', healthy: !!healthy };
}

// The queue behind events(): the events no handler took.
class Sink {
  constructor(maxPending) {
    this.maxPending = maxPending || DEFAULT_MAX_PENDING;
    this.queue = [];
    this.head = 0;
    this.waiters = [];
    this.ended = false;
  }

  // Queues ev for events(); false when the queue is full.
  put(ev) {
    if (this.ended) return true;
    if (this.queue.length - this.head >= this.maxPending) return false;
    const w = this.waiters.shift();
    if (w) {
      w(ev);
      return true;
    }
    this.queue.push(ev);
    return true;
  }

  end() {
    this.ended = true;
    for (const w of this.waiters.splice(0)) w(null);
  }

  // The next queued event; null after timeoutMs (if given) or once the
  // listener is dead and the queue drained.
  get(timeoutMs) {
    if (this.head < this.queue.length) {
      const ev = this.queue[this.head];
      this.queue[this.head++] = undefined;
      if (this.head > 1024 && this.head * 2 > this.queue.length) {
        this.queue = this.queue.slice(this.head);
        this.head = 0;
      }
      return Promise.resolve(ev);
    }
    if (this.ended) return Promise.resolve(null);
    return new Promise((resolve) => {
      let timer = null;
      const w = (ev) => {
        if (timer) clearTimeout(timer);
        resolve(ev);
      };
      this.waiters.push(w);
      if (timeoutMs !== undefined && timeoutMs !== null) {
        timer = setTimeout(() => {
          const i = this.waiters.indexOf(w);
          if (i >= 0) this.waiters.splice(i, 1);
          resolve(null);
        }, timeoutMs);
      }
    });
  }

  async *events() {
    for (;;) {
      const ev = await this.get();
      if (ev === null) return;
      yield ev;
    }
  }
}

// What Client, Local and Failover share: an EventEmitter in node-postgres's
// style, the queued events and the end. Events: 'wake' (a wake), 'status'
// (the Postgres connection's health, a boolean), 'error' (the error the
// listener died of, once; not for close(), and only when an 'error'
// listener is registered: a death is also done's value, so it never throws
// an unhandled 'error'), and 'end' (after death or close()).
//
// The listeners and the iterator never take from each other: every wake and
// status is emitted to the listeners of its kind, and also queued for
// events() (and get(), and for await on the listener itself) from the start,
// unless a 'wake' or 'status' listener (onWake, onStatus) was added before
// the first events() or get(): such a listener is in callback mode, and its
// iterator sees every event from that first call on. A listener added while
// iterating (a debug log) takes nothing from the iterator. A subclass calls
// _init(opts) and _ended(err) at death.
class Listener extends EventEmitter {
  // Sets up the queue and the done promise, and registers opts.onWake and
  // opts.onStatus as listeners.
  _init(opts) {
    this._sink = new Sink(opts.maxPending || DEFAULT_MAX_PENDING);
    this.err = null;
    this.done = new Promise((resolve) => {
      this._resolveDone = resolve;
    });
    this._iterating = false; // events() or get() was called
    this._listened = false; // a 'wake' or 'status' listener was added
    this.on('newListener', (type) => {
      if (type === 'wake' || type === 'status') this._listened = true;
    });
    if (opts.onWake) this.on('wake', opts.onWake);
    if (opts.onStatus) this.on('status', opts.onStatus);
  }

  // At death (once): the queue ends, done resolves, 'error' and 'end' are
  // emitted.
  _ended(err) {
    this._sink.end();
    this._resolveDone(err);
    if (!(err instanceof ClosedError) && this.listenerCount('error') > 0) {
      try {
        this.emit('error', err);
      } catch (e) {
        process.emitWarning(`listenhub: 'error' listener threw: ${e && e.stack ? e.stack : e}`);
      }
    }
    this.emit('end', err);
  }

  // Async iterator over the events without a callback, until the listener
  // is dead and the queue drained.
  events() {
    this._iterating = true;
    return this._sink.events();
  }

  // for await (const ev of listener): the same as events().
  [Symbol.asyncIterator]() {
    return this.events();
  }

  // The next queued event; null after timeoutMs or at the end.
  get(timeoutMs) {
    this._iterating = true;
    return this._sink.get(timeoutMs);
  }

  // Resolves with err once the listener is dead.
  wait() {
    return this.done;
  }

  // Emits ev to its listeners (a throw is a warning, not the listener's
  // death) and queues it for events() unless in callback mode (see
  // Listener); false when the queue is full.
  _handOver(ev) {
    if (this.listenerCount(ev.type) > 0) {
      try {
        this.emit(ev.type, ev.type === 'wake' ? ev : ev.healthy);
      } catch (e) {
        process.emitWarning(`listenhub: callback threw: ${e && e.stack ? e.stack : e}`);
      }
    }
    if (this._iterating || !this._listened) return this._sink.put(ev);
    return true;
  }

  // The error a listener dies with when events() was not drained.
  _slowConsumer() {
    return new SlowConsumerError(`listenhub: more than ${this._sink.maxPending} events not taken from events()`);
  }
}

module.exports = { DEFAULT_MAX_PENDING, Listener, Sink, wake, status };
