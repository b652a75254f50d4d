// Type-checked (never run) against the installed package's declarations:
// what a TypeScript user writes must compile, and misuse must not.
import { connect, Failover, ConnError, InvalidNameError, HUB, OtherDatabaseError, type Wake, type Event } from 'listenhub';
import createSubscriber from 'listenhub/pg-listen';
import { hubPool } from 'listenhub/graphile-worker';

export async function main(sock: string, url: string): Promise<void> {
  const c = await connect(sock, {
    ackTimeout: 1000,
    onWake: (w: Wake) => {
      const p: string | null = w.payload;
      const d: boolean = w.durable;
      void p, d;
    },
    onStatus: (healthy: boolean) => void healthy,
  });
  await c.subscribe('orders', { signal: AbortSignal.timeout(500) });
  c.unsubscribe('orders');
  for await (const ev of c) {
    const e: Event = ev;
    void e;
    break;
  }
  for await (const ev of c.events()) {
    const e: Event = ev;
    if (e.type === 'status') {
      const h: boolean = e.healthy;
      void h;
    }
  }
  const f = await Failover.create(sock, { databaseUrl: url, oneWay: false, onFailover: (e: Error) => void e });
  f.on('wake', (w: Wake) => void w.name);
  f.on('status', (healthy: boolean) => void healthy);
  f.on('error', (err: Error) => void err.message);
  f.on('failback', () => undefined);
  if (f.mode() === HUB) await f.close();
  const closed: Promise<void> = c.close();
  await closed;
  try {
    await f.subscribe('x');
  } catch (e) {
    if (e instanceof ConnError) console.log(e.op, e.path);
    if (e instanceof InvalidNameError) console.log(e.subscriptionName, e.reason);
  }
  // @ts-expect-error: names are strings
  await c.subscribe(42);
  // @ts-expect-error: a wake handler takes a Wake
  c.on('wake', (w: number) => void w);
  // @ts-expect-error: no such option
  await connect(sock, { ackTimeOut: 1 });
  if (f.reason instanceof OtherDatabaseError) console.log(f.reason.database);

  // pg-listen's surface, through the hub.
  const sub = createSubscriber({ connectionString: url }, { socketPath: sock, paranoidChecking: false });
  sub.notifications.on('jobs', (payload: unknown) => void payload);
  sub.events.on('error', (e: Error) => console.error(e));
  await sub.connect();
  await sub.listenTo('jobs');
  await sub.notify('jobs', { id: 1 });
  const chans: string[] = sub.getSubscribedChannels();
  void chans;
  await sub.close();
  // @ts-expect-error: no such option
  createSubscriber({}, { socket: sock });
  // pg-listen's type parameter: a payload type per channel.
  const typed = createSubscriber<{ greeting: { hello: string }; ping: void }>({ connectionString: url });
  typed.notifications.on('greeting', (p) => void p.hello.toUpperCase());
  await typed.notify('greeting', { hello: 'world' });
  await typed.notify('ping');
  // @ts-expect-error: the payload's type is the channel's
  await typed.notify('greeting', { hola: 'mundo' });
  // @ts-expect-error: no such channel
  typed.notifications.on('nope', () => undefined);

  // graphile-worker's pgPool.
  const fakePool = { connect: () => undefined, options: {} };
  const same: typeof fakePool = hubPool(fakePool, { socketPath: sock });
  void same;
}
