// listenhub/pg-listen: pg-listen's API (1.7), through the hub.
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

/** The type-safe emitter pg-listen declares (typed-emitter's shape). */
export interface TypedEventEmitter<Events> {
  addListener<E extends keyof Events>(event: E, listener: Events[E]): this;
  on<E extends keyof Events>(event: E, listener: Events[E]): this;
  once<E extends keyof Events>(event: E, listener: Events[E]): this;
  prependListener<E extends keyof Events>(event: E, listener: Events[E]): this;
  prependOnceListener<E extends keyof Events>(event: E, listener: Events[E]): this;
  off<E extends keyof Events>(event: E, listener: Events[E]): this;
  removeAllListeners<E extends keyof Events>(event?: E): this;
  removeListener<E extends keyof Events>(event: E, listener: Events[E]): this;
  emit<E extends keyof Events>(event: E, ...args: Events[E] extends (...a: infer A) => any ? A : never): boolean;
  eventNames(): (keyof Events)[];
  listeners<E extends keyof Events>(event: E): Function[];
  listenerCount<E extends keyof Events>(event: E): number;
  getMaxListeners(): number;
  setMaxListeners(maxListeners: number): this;
}

export interface PgListenEvents {
  connected: () => void;
  error: (error: Error) => void;
  notification: (notification: PgParsedNotification) => void;
  reconnect: (attempt: number) => void;
}

type EventsToEmitterHandlers<Events extends Record<string, any>> = {
  [channelName in keyof Events]: (payload: Events[channelName]) => void;
};

/**
 * pg-listen's Subscriber, with its type parameter: Events maps each
 * channel to its payload's type (void: no payload).
 */
export interface Subscriber<Events extends Record<string, any> = { [channel: string]: any }> {
  /** Events: "connected", "error", "notification", "reconnect". */
  events: TypedEventEmitter<PgListenEvents>;
  /** One event per channel, with the parsed payload. */
  notifications: TypedEventEmitter<EventsToEmitterHandlers<Events>>;
  connect(): Promise<void>;
  close(): Promise<void>;
  getSubscribedChannels(): string[];
  listenTo(channelName: string): Promise<unknown> | undefined;
  notify<EventName extends keyof Events>(
    channelName: any extends Events[EventName] ? EventName : void extends Events[EventName] ? never : EventName,
    payload: Events[EventName] extends void ? never : Events[EventName],
  ): Promise<unknown>;
  notify<EventName extends keyof Events>(channelName: void extends Events[EventName] ? EventName : never): Promise<unknown>;
  unlisten(channelName: string): Promise<unknown> | undefined;
  unlistenAll(): Promise<unknown>;
}

declare function createPostgresSubscriber<Events extends Record<string, any> = { [channel: string]: any }>(
  connectionConfig?: { connectionString?: string; [key: string]: unknown },
  options?: Options,
): Subscriber<Events>;
export { createPostgresSubscriber };
export default createPostgresSubscriber;
