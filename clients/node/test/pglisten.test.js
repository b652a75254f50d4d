'use strict';

// listenhub/pg-listen against a real hub and a real Postgres. The first
// cases are pg-listen's own integration tests (test/integration.test.ts in
// the andywer/pg-listen repository, MIT licensed), ported case by case and
// run against both pg-listen 1.7.0 from npm and this subscriber: the same
// test body, so that switching is the import line. Where the two differ on
// purpose (a gap is said; the backend killed is scoped to the subscriber's,
// not every backend of the user, which would end other suites' sessions)
// the case says so.

const test = require('node:test');
const assert = require('node:assert/strict');

const createHubSubscriber = require('../pg-listen');
const createPgListen = require('pg-listen');
const { DATABASE_URL, skip, waitFor, Hub, DB } = require('./hubtest');

// Each implementation, with what it needs: a hub for ours.
const impls = [
  {
    name: 'pg-listen',
    async make(t, app, options = {}) {
      return createPgListen({ connectionString: DATABASE_URL, application_name: app }, options);
    },
    // Who LISTENs for it: its own backend.
    listenerApp: (app) => app,
  },
  {
    name: 'listenhub/pg-listen',
    async make(t, app, options = {}) {
      const h = await Hub.start(t.name + '-' + app);
      t.after(() => h.kill());
      this.hub = h;
      return createHubSubscriber(
        { connectionString: DATABASE_URL, application_name: app },
        { socketPath: h.socket, failover: { applicationName: app, minLocal: 50, probeInterval: 50 }, ...options },
      );
    },
    listenerApp() {
      return this.hub.app;
    },
  },
];

// A fence: a notification on a channel of its own, sent after what is
// checked; once it arrived, what was sent before it has too (one
// connection's NOTIFYs arrive in commit order).
async function fence(sub, seen) {
  const mark = `fence-${Math.random()}`;
  await sub.notify('fence', mark);
  await waitFor('the fence', () => seen.some((n) => n.channel === 'fence' && n.payload === mark));
}

for (const impl of impls) {
  test(`${impl.name}: can connect`, { skip }, async (t) => {
    const sub = await impl.make(t, 'lhpgl-connect');
    await sub.connect();
    await sub.close();
  });

  test(`${impl.name}: can listen and notify`, { skip }, async (t) => {
    const notifications = [];
    const receivedPayloads = [];
    const sub = await impl.make(t, 'lhpgl-notify');
    await sub.connect();
    try {
      await sub.listenTo('test');
      sub.events.on('notification', (n) => notifications.push(n));
      sub.notifications.on('test', (p) => receivedPayloads.push(p));

      await sub.notify('test', { hello: 'world' });
      await sub.notify('test2', 'should not be received, since not subscribed to channel test2');
      assert.deepEqual(sub.getSubscribedChannels(), ['test']);
      await sub.listenTo('fence');
      await fence(sub, notifications);

      assert.deepEqual(
        notifications.filter((n) => n.channel !== 'fence'),
        [{ channel: 'test', payload: { hello: 'world' }, processId: notifications[0].processId }],
      );
      assert.deepEqual(receivedPayloads, [{ hello: 'world' }]);
    } finally {
      await sub.close();
    }
  });

  // pg-listen's case terminates every other backend of the user; here only
  // the one that LISTENs for the subscriber (pg-listen's own; the hub's).
  // pg-listen reconnects (one 'reconnect') and loses what was sent in
  // between in silence; through the hub the subscriber's connection is
  // untouched, the hub reconnects, and says the gap with one notification
  // without payload.
  test(`${impl.name}: getting notified after connection is terminated`, { skip }, async (t) => {
    const notifications = [];
    const receivedPayloads = [];
    let reconnects = 0;
    const app = 'lhpgl-terminate';
    const sub = await impl.make(t, app, { paranoidChecking: 1000 });
    await sub.connect();
    const db = await DB.open();
    try {
      await sub.listenTo('test');
      sub.events.on('notification', (n) => notifications.push(n));
      sub.events.on('reconnect', () => reconnects++);
      sub.notifications.on('test', (p) => receivedPayloads.push(p));

      const victim = impl.listenerApp(app);
      await db.conn.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1', [victim]);
      await waitFor('the listener back', async () => (await db.backends(victim)) === 1);

      // NOTIFY until one arrives: the listener may still be LISTENing
      // again.
      let sent = 0;
      await waitFor('a notification after the termination', async () => {
        if (receivedPayloads.some((p) => p && p.hello === 'world')) return true;
        await db.conn.query(`NOTIFY test, '{"hello": "world"}'`);
        sent++;
        return false;
      });
      assert.deepEqual(sub.getSubscribedChannels(), ['test']);
      const withPayload = notifications.filter((n) => n.payload !== undefined);
      assert.ok(withPayload.length >= 1 && withPayload.length <= sent);
      assert.deepEqual(withPayload[0], { channel: 'test', payload: { hello: 'world' }, processId: withPayload[0].processId });
      if (impl.name === 'pg-listen') {
        assert.equal(reconnects, 1);
      } else {
        assert.equal(reconnects, 0, 'the hub reconnects, not the subscriber');
        await waitFor('the gap said', () => notifications.some((n) => n.channel === 'test' && n.payload === undefined));
      }
    } finally {
      await db.close();
      await sub.close();
    }
  });

  test(`${impl.name}: a payload that is not JSON is an 'error' event`, { skip }, async (t) => {
    const sub = await impl.make(t, 'lhpgl-badjson');
    const errors = [];
    sub.events.on('error', (e) => errors.push(e));
    await sub.connect();
    const db = await DB.open();
    try {
      await sub.listenTo('test');
      await db.notify('test', 'not json');
      await waitFor('the error', () => errors.length === 1);
      assert.match(errors[0].message, /^Error parsing PostgreSQL notification payload: /);
    } finally {
      await db.close();
      await sub.close();
    }
  });

  test(`${impl.name}: parse and serialize options`, { skip }, async (t) => {
    const sub = await impl.make(t, 'lhpgl-serialize', { serialize: (d) => `<${d}>`, parse: (s) => s.toUpperCase() });
    const got = [];
    sub.notifications.on('test', (p) => got.push(p));
    await sub.connect();
    try {
      await sub.listenTo('test');
      await sub.notify('test', 'abc');
      await waitFor('the payload', () => got.length === 1);
      assert.deepEqual(got, ['<ABC>']);
    } finally {
      await sub.close();
    }
  });

  test(`${impl.name}: unlisten and unlistenAll stop delivery`, { skip }, async (t) => {
    const sub = await impl.make(t, 'lhpgl-unlisten');
    const seen = [];
    sub.events.on('notification', (n) => seen.push(n));
    await sub.connect();
    try {
      await sub.listenTo('a');
      await sub.listenTo('b');
      assert.equal(sub.listenTo('a'), undefined, 'a second listenTo is a no-op');
      await sub.unlisten('a');
      assert.equal(sub.unlisten('a'), undefined, 'a second unlisten is a no-op');
      assert.deepEqual(sub.getSubscribedChannels(), ['b']);
      await sub.listenTo('fence');
      await sub.notify('a', 1);
      await sub.notify('b', 2);
      await fence(sub, seen);
      assert.deepEqual(seen.filter((n) => n.channel !== 'fence').map((n) => [n.channel, n.payload]), [['b', 2]]);
      await sub.unlistenAll();
      assert.deepEqual(sub.getSubscribedChannels(), []);
      await sub.listenTo('fence');
      seen.length = 0;
      await sub.notify('b', 3);
      await fence(sub, seen);
      assert.deepEqual(seen.filter((n) => n.channel !== 'fence'), []);
    } finally {
      await sub.close();
    }
  });
}

// Ours only: the hub killed, the subscriber falls back to its own LISTEN
// ('reconnect', then 'connected'), keeps receiving, and returns to the hub
// ('connected') once it is back.
test('listenhub/pg-listen: hub killed and back', { skip }, async (t) => {
  const app = 'lhpgl-failover';
  const h = await Hub.start(t.name);
  t.after(() => h.kill());
  const sub = createHubSubscriber(
    { connectionString: DATABASE_URL },
    { socketPath: h.socket, failover: { applicationName: app, minLocal: 50, probeInterval: 50 } },
  );
  const events = [];
  for (const e of ['connected', 'reconnect']) sub.events.on(e, () => events.push(e));
  const got = [];
  sub.notifications.on('jobs', (p) => got.push(p));
  await sub.connect();
  const db = await DB.open();
  try {
    await sub.listenTo('jobs');
    await h.kill();
    await waitFor('the local LISTEN', async () => (await db.backends(app)) === 1);
    await waitFor('a wake through the local LISTEN', async () => {
      await db.notify('jobs', JSON.stringify({ n: 1 }));
      return got.some((p) => p && p.n === 1);
    });
    const h2 = await Hub.start(t.name, { socket: h.socket });
    t.after(() => h2.kill());
    await waitFor('back on the hub', async () => (await db.backends(app)) === 0);
    await waitFor('a wake through the hub again', async () => {
      await db.notify('jobs', JSON.stringify({ n: 2 }));
      return got.some((p) => p && p.n === 2);
    });
    assert.deepEqual(events.slice(0, 4), ['connected', 'reconnect', 'connected', 'connected']);
  } finally {
    await db.close();
    await sub.close();
  }
});

// The census: K subscribers (as K processes of a preforking server would
// hold) are K LISTEN backends with pg-listen, and the hub's one through it.
test('census: K subscribers, K backends with pg-listen, 1 through the hub', { skip }, async (t) => {
  const K = 4;
  const db = await DB.open();
  t.after(() => db.close());
  const plainApp = 'lhpgl-census-plain';
  const plain = [];
  for (let i = 0; i < K; i++) {
    const s = createPgListen({ connectionString: DATABASE_URL, application_name: plainApp });
    await s.connect();
    await s.listenTo('jobs');
    plain.push(s);
  }
  const h = await Hub.start(t.name);
  t.after(() => h.kill());
  const localApp = 'lhpgl-census-local';
  const hubbed = [];
  for (let i = 0; i < K; i++) {
    const s = createHubSubscriber({ connectionString: DATABASE_URL }, { socketPath: h.socket, failover: { applicationName: localApp } });
    await s.connect();
    await s.listenTo('jobs');
    hubbed.push(s);
  }
  try {
    const withPgListen = await db.backends(plainApp);
    const throughHub = (await db.backends(localApp)) + (await db.backends(h.app));
    t.diagnostic(`census, ${K} subscribers: ${withPgListen} LISTEN backends with pg-listen, ${throughHub} through the hub`);
    assert.equal(withPgListen, K);
    assert.equal(throughHub, 1);
  } finally {
    await Promise.all([...plain, ...hubbed].map((s) => s.close()));
  }
});


// Ours only: a connect that fails (no hub, no database) rejects, and a
// later one, once they are there, succeeds.
test('listenhub/pg-listen: a failed connect can be retried', { skip }, async (t) => {
  const path = require('node:path');
  const { tmpDir } = require('./hubtest');
  const sock = path.join(tmpDir('lhnode-'), 'hub.sock');
  const sub = createHubSubscriber(
    { connectionString: 'postgres://nobody@127.0.0.1:1/none?connect_timeout=1' },
    { socketPath: sock, failover: { localTimeout: 1000 } },
  );
  await assert.rejects(sub.connect());
  const h = await Hub.start(t.name, { socket: sock });
  t.after(() => h.kill());
  await sub.connect();
  const got = [];
  sub.notifications.on('jobs', (p) => got.push(p));
  await sub.listenTo('jobs');
  const db = await DB.open();
  t.after(() => db.close());
  await db.notify('jobs', '{"n":1}');
  await waitFor('the wake', () => got.length === 1);
  await sub.close();
});
