'use strict';

// graphile-worker on the hub. graphile-worker (0.18) takes a pg Pool as its
// pgPool option and, for its wakes, asks that pool for one dedicated client
// in the callback form, pool.connect(callback), on which it LISTENs to
// "jobs:insert" and "worker:migrate". hubPool(pool) is that pool with the
// callback form answered by a client whose LISTEN goes through the host's
// hub (a Failover: its own LISTEN connection while the hub is away):
//
//   const { hubPool } = require('listenhub/graphile-worker');
//   await run({ pgPool: hubPool(new Pool({ connectionString })), taskList });
//
// Every other use of the pool (the promise form of connect, query, end,
// events) is the pool's own, and so is any statement other than LISTEN and
// UNLISTEN sent through the hub client (on a connection of the pool). After
// a gap in which notifications may have been lost, "jobs:insert" gets a
// notification that nudges every idle worker (graphile-worker's payload
// {"count": n}); "worker:migrate" gets none: a gap there is not
// reconstructed (graphile-worker's own payloads say whether a migration
// was breaking).

const { EventEmitter } = require('node:events');

const { Failover } = require('./failover');
const { DEFAULT_SOCKET } = require('./pglisten');

// A gap's nudge: more than any pool has workers.
const GAP_NUDGE = JSON.stringify({ count: 1 << 30 });

// LISTEN and UNLISTEN statements, one or several separated by semicolons,
// each with a plain or double-quoted channel name; null for anything else.
function listenStatements(text) {
  if (typeof text !== 'string') return null;
  const out = [];
  const re = /^\s*(LISTEN|UNLISTEN)\s+(?:"((?:[^"]|"")+)"|([A-Za-z_][A-Za-z0-9_$]*))\s*(?:;|$)/i;
  let rest = text;
  while (rest.trim() !== '') {
    const m = re.exec(rest);
    if (!m) return null;
    out.push({ listen: m[1].toUpperCase() === 'LISTEN', channel: m[2] !== undefined ? m[2].replace(/""/g, '"') : m[3].toLowerCase() });
    rest = rest.slice(m[0].length);
  }
  return out.length > 0 ? out : null;
}

// The client handed to graphile-worker's listener: node-postgres's
// 'notification' and 'error' events, query() and release().
class HubListenClient extends EventEmitter {
  constructor(pool, failover) {
    super();
    this._pool = pool;
    this._failover = failover;
    this.processID = 0;
  }

  query(text, values, callback) {
    if (typeof values === 'function') {
      callback = values;
      values = undefined;
    }
    const stmts = typeof text === 'string' && values === undefined ? listenStatements(text) : null;
    const p = stmts ? this._listen(stmts) : this._pool.query(text, values);
    if (callback) {
      p.then((r) => callback(null, r), (e) => callback(e));
      return undefined;
    }
    return p;
  }

  async _listen(stmts) {
    for (const s of stmts) {
      if (s.listen) await this._failover.subscribe(s.channel);
      else this._failover.unsubscribe(s.channel);
    }
    return { command: stmts[stmts.length - 1].listen ? 'LISTEN' : 'UNLISTEN', rowCount: null, rows: [], fields: [] };
  }

  release() {
    return this._failover.close();
  }
}

// hubPool returns pool with its callback-form connect answered by a client
// that LISTENs through the hub at options.socketPath (else
// LISTENHUB_SOCKET, else /run/listenhub/listenhub.sock). options.failover
// are more Failover options; the local fallback connects as the pool does.
function hubPool(pool, options = {}) {
  const socketPath = options.socketPath || process.env.LISTENHUB_SOCKET || DEFAULT_SOCKET;
  const connectListener = (callback) => {
    let client = null;
    const onWake = (w) => {
      if (!client) return;
      let payload = w.payload;
      if (w.durable) {
        if (w.name !== 'jobs:insert') return;
        payload = GAP_NUDGE;
      }
      client.emit('notification', { processId: 0, channel: w.name, payload });
    };
    Failover.create(socketPath, {
      ...options.failover,
      connectionConfig: pool.options && Object.keys(pool.options).length > 0 ? { ...pool.options } : undefined,
      onWake,
    }).then(
      (f) => {
        client = new HubListenClient(pool, f);
        f.on('end', (err) => {
          if (err && err.name !== 'ClosedError') client.emit('error', err);
        });
        callback(null, client, () => f.close());
      },
      (err) => callback(err),
    );
  };
  return new Proxy(pool, {
    get(target, prop) {
      if (prop === 'connect') {
        return (callback) => (typeof callback === 'function' ? connectListener(callback) : target.connect());
      }
      const v = Reflect.get(target, prop, target);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
}

module.exports = { hubPool, listenStatements };
