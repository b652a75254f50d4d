// listenhub/graphile-worker: graphile-worker's pgPool, its LISTEN through the hub.
import type { FailoverOptions } from './index';

export interface HubPoolOptions {
  /** The hub's socket; default LISTENHUB_SOCKET, then /run/listenhub/listenhub.sock. */
  socketPath?: string;
  /** More options of the Failover underneath. */
  failover?: Omit<FailoverOptions, 'onWake' | 'onStatus' | 'connectionConfig'>;
}

/** pool, with the dedicated client graphile-worker LISTENs on going through the hub. */
export function hubPool<P extends { connect(...args: any[]): any; options?: object }>(pool: P, options?: HubPoolOptions): P;
