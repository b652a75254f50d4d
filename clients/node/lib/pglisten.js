'use strict';

// A subscriber with pg-listen's surface (createPostgresSubscriber, its
// methods, its two emitters and their event names, JSON payloads) whose
// notifications come through the host's hub: switching is the import line.
//
//   const createSubscriber = require('listenhub/pg-listen'); // was 'pg-listen'
//
// Channels are subscription names as they are: the hub must serve them
// unmapped (no --channel-prefix or --channel-suffix). The hub's socket is
// options.socketPath, else LISTENHUB_SOCKET, else
// /run/listenhub/listenhub.sock. Underneath is a Failover: when the hub is
// away the subscriber LISTENs on its own connection (pg, with the
// connection config given), and returns to the hub when it is back.
//
// Where it differs from pg-listen, and why:
// - After a gap in which notifications may have been lost (the hub's own
//   reconnect to Postgres, a failover either way), one notification without
//   payload (payload undefined, as pg-listen gives for a NOTIFY without
//   one) is emitted per subscribed channel: pg-listen loses them in silence.
// - processId is 0: the hub's wire does not carry the notifying backend.
// - notify() runs on a pool of at most one connection of its own, closed
//   when idle: the subscriber holds no Postgres connection while it only
//   listens.
// - 'reconnect' (attempt 1) and then 'connected' are emitted when it falls
//   back to its own connection, 'connected' again when it is back on the
//   hub; the hub's own reconnects to Postgres are the hub's business.
//   paranoidChecking, retryInterval, retryLimit, retryTimeout and native are
//   accepted and not used: the hub and the local listener check their
//   connections themselves.

const { EventEmitter } = require('node:events');

const { Failover } = require('./failover');
const { ClosedError } = require('./errors');

const DEFAULT_SOCKET = '/run/listenhub/listenhub.sock';

function createPostgresSubscriber(connectionConfig, options = {}) {
  const parse = options.parse || JSON.parse;
  const serialize = options.serialize || JSON.stringify;
  const socketPath = options.socketPath || process.env.LISTENHUB_SOCKET || DEFAULT_SOCKET;

  const events = new EventEmitter();
  events.setMaxListeners(0);
  const notifications = new EventEmitter();
  notifications.setMaxListeners(0);
  events.on('notification', (n) => notifications.emit(n.channel, n.payload));

  let failover = null;
  let connecting = null;
  let closing = false;
  let notifyPool = null;
  const subscribed = new Set();

  const onWake = (w) => {
    // Unsubscribing does not wait for the hub: what it still sends for a
    // channel no longer listened to is dropped here, as after UNLISTEN.
    if (!subscribed.has(w.name)) return;
    let payload;
    try {
      payload = w.payload ? parse(w.payload) : undefined;
    } catch (error) {
      error.message = 'Error parsing PostgreSQL notification payload: ' + error.message;
      events.emit('error', error);
      return;
    }
    events.emit('notification', { processId: 0, channel: w.name, payload });
  };

  const failoverOptions = () => {
    return {
      ...options.failover,
      connectionConfig: connectionConfig && Object.keys(connectionConfig).length > 0 ? connectionConfig : undefined,
      onWake,
      onFailover: () => {
        events.emit('reconnect', 1);
        events.emit('connected');
      },
      onFailback: () => events.emit('connected'),
    };
  };

  return {
    events,
    notifications,

    // Connects to the hub (or, without it, to Postgres) and emits
    // 'connected'. Resolves once subscribing works.
    async connect() {
      if (failover) return;
      if (!connecting) {
        connecting = Failover.create(socketPath, failoverOptions()).then((f) => {
          if (closing) {
            f.close();
            throw new ClosedError();
          }
          failover = f;
          f.on('end', (err) => {
            if (!closing && !(err instanceof ClosedError)) {
              err.message = 'The listenhub notification subscriber failed: ' + err.message;
              events.emit('error', err);
            }
          });
          return f;
        });
        // A failed connect can be tried again, as pg-listen's can.
        connecting.catch(() => {
          if (!failover) connecting = null;
        });
      }
      await connecting;
      events.emit('connected');
    },

    close() {
      closing = true;
      const done = [];
      if (failover) done.push(failover.close());
      if (notifyPool) done.push(notifyPool.end());
      return Promise.all(done).then(() => undefined);
    },

    getSubscribedChannels() {
      return Array.from(subscribed);
    },

    listenTo(channelName) {
      if (subscribed.has(channelName)) return undefined;
      subscribed.add(channelName);
      return ensure().then((f) => f.subscribe(channelName));
    },

    notify(channelName, payload) {
      if (!notifyPool) {
        const { Pool } = require('pg');
        notifyPool = new Pool({ ...connectionConfig, max: 1, idleTimeoutMillis: 10000 });
        notifyPool.on('error', () => {}); // an idle connection's loss: the next query reconnects
      }
      if (payload !== undefined) {
        return notifyPool.query('SELECT pg_notify($1, $2)', [channelName, serialize(payload)]);
      }
      return notifyPool.query("SELECT pg_notify($1, '')", [channelName]);
    },

    unlisten(channelName) {
      if (!subscribed.has(channelName)) return undefined;
      subscribed.delete(channelName);
      if (failover) failover.unsubscribe(channelName);
      return Promise.resolve();
    },

    unlistenAll() {
      const all = Array.from(subscribed);
      subscribed.clear();
      if (failover) for (const c of all) failover.unsubscribe(c);
      return Promise.resolve();
    },
  };

  // The Failover, once connect() made it: pg-listen's LISTEN before connect
  // fails on the unconnected client, and so does this one.
  function ensure() {
    if (failover) return Promise.resolve(failover);
    if (connecting) return connecting;
    return Promise.reject(new Error('listenhub pg-listen subscriber: call connect() first'));
  }
}

module.exports = { createPostgresSubscriber, DEFAULT_SOCKET };
