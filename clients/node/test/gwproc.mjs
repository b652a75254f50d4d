// A graphile-worker process for graphile.test.js: run() on a pool of its
// own, its LISTEN either the pool's own (LHGW_MODE=plain, the pool tagged
// LHGW_APP) or through the hub at LHGW_SOCKET (LHGW_MODE=hub, local
// listeners tagged LHGW_APP). Each job prints {"n", "latency"} (ms from the
// adder's addedAt); "listening" once graphile-worker LISTENs; it stops when
// stdin closes.
import { EventEmitter } from 'node:events';
import pg from 'pg';
import { Logger, run } from 'graphile-worker';
import { hubPool } from '../graphile-worker.mjs';

const env = process.env;
const plain = env.LHGW_MODE === 'plain';
const pool = new pg.Pool({
  connectionString: env.LHTEST_DATABASE_URL,
  application_name: plain ? env.LHGW_APP : 'lhgw-worker',
  max: 4,
});
// graphile-worker asks for error handlers on the pool and its clients.
pool.on('error', () => {});
pool.on('connect', (client) => client.on('error', () => {}));
const pgPool = plain
  ? pool
  : hubPool(pool, { socketPath: env.LHGW_SOCKET, failover: { applicationName: env.LHGW_APP, minLocal: 100, probeInterval: 100 } });
const quiet = new Logger(() => (level, message) => {
  if (level === 'error') process.stderr.write(`gwproc: ${message}\n`);
});
const events = new EventEmitter();
events.on('pool:listen:success', () => process.stdout.write('listening\n'));
const runner = await run({
  pgPool,
  events,
  schema: env.LHGW_SCHEMA,
  concurrency: 2,
  pollInterval: 60000,
  noHandleSignals: true,
  logger: quiet,
  taskList: {
    lhgw: async (payload) => {
      process.stdout.write(JSON.stringify({ n: payload.n, latency: Date.now() - payload.addedAt }) + '\n');
    },
  },
});
process.stdin.on('end', async () => {
  await runner.stop();
  await pool.end();
  process.exit(0);
});
process.stdin.resume();
