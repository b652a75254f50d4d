// An ESM consumer of the installed package: named imports, the same classes
// as require() hands out, a wake through the hub at argv[2], then a
// Failover on a socket nobody serves (argv[4]) that must go local through
// pg (the package's own dependency) and get a wake there too.
import { connect, Failover, ConnError, LOCAL } from 'listenhub';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
if (require('listenhub').ConnError !== ConnError) throw new Error('ESM and CommonJS hand out different classes');

const [sock, q, noHub, url] = process.argv.slice(2);

async function firstPayload(x, what) {
  for (;;) {
    const ev = await x.get(20000);
    if (ev === null) throw new Error(`no wake ${what} within 20 s`);
    if (ev.type === 'wake' && ev.payload !== null) return;
  }
}

const c = await connect(sock);
await c.subscribe(q);
await firstPayload(c, 'through the hub');
c.close();
console.log('esm: wake through the hub');

const f = await Failover.create(noHub, { databaseUrl: url, oneWay: true });
if (f.mode() !== LOCAL) throw new Error(`mode ${f.mode()}, want local`);
await f.subscribe(q);
await firstPayload(f, 'on the local listener');
f.close();
console.log('esm: wake on the local listener (pg)');
