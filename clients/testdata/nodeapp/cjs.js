'use strict';
// A CommonJS consumer of the installed package: subscribes through the hub
// at argv[2] to argv[3] and exits 0 once a wake with a payload arrives.
const { connect, ConnError } = require('listenhub');

(async () => {
  if (typeof ConnError !== 'function') throw new Error('ConnError is not exported');
  const [sock, q] = process.argv.slice(2);
  const c = await connect(sock);
  await c.subscribe(q);
  for (;;) {
    const ev = await c.get(20000);
    if (ev === null) throw new Error('no wake through the hub within 20 s');
    if (ev.type === 'wake' && ev.payload !== null) break;
  }
  c.close();
  console.log('cjs: wake through the hub');
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
