// listenhub/pg-listen: pg-listen's API (1.7), through the hub.
import { EventEmitter } from 'node:events';
import type { FailoverOptions } from './index';

export interface PgParsedNotification {
  processId: number;
  channel: string;
  payload?: any;
}

export interface Options {
  /** The hub's socket; default LISTENHUB_SOCKET, then /run/listenhub/listenhub.sock. */
  socketPath?: string;
  /** More options of the Failover underneath (ack timeout, fail-back pacing). */
  failover?: Omit<FailoverOptions, 'onWake' | 'onStatus' | 'connectionConfig'>;
  /** Defaults to JSON.parse. */
  parse?: (serialized: string) => any;
  /** Defaults to JSON.stringify. */
  serialize?: (data: any) => string;
  /** Accepted for pg-listen compatibility; not used. */
  native?: boolean;
  paranoidChecking?: number | false;
  retryInterval?: number | ((attempt: number) => number);
  retryLimit?: number;
  retryTimeout?: number;
}

export interface Subscriber {
  /** Events: "connected", "error", "notification", "reconnect". */
  events: EventEmitter;
  /** One event per channel, with the parsed payload. */
  notifications: EventEmitter;
  connect(): Promise<void>;
  close(): Promise<void>;
  getSubscribedChannels(): string[];
  listenTo(channelName: string): Promise<void> | undefined;
  notify(channelName: string, payload?: any): Promise<unknown>;
  unlisten(channelName: string): Promise<void> | undefined;
  unlistenAll(): Promise<void>;
}

declare function createPostgresSubscriber(connectionConfig?: { connectionString?: string; [key: string]: unknown }, options?: Options): Subscriber;
export { createPostgresSubscriber };
export default createPostgresSubscriber;
