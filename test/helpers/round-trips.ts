import type { Redis } from 'ioredis';

/** A command sent: its name, its first key (a script's) or first argument, its round trip. */
export interface Sent {
  name: string;
  first: string;
  trip: number;
}

/**
 * Counts the round trips `redis` makes while `counting()` says so, and the commands it sends (each
 * with its first key, or first argument, and the round trip it went out in, from 0). A round trip
 * is a stretch from a command sent while none was outstanding to the reply that leaves none
 * outstanding: commands sent together and answered together count once.
 */
export function countTrips(
  redis: Redis,
  counting: () => boolean,
): { trips: number; commands: string[]; sent: Sent[] } {
  const counts = { trips: 0, commands: [] as string[], sent: [] as Sent[] };
  let outstanding = 0;
  let open = false;
  const send = redis.sendCommand.bind(redis);
  redis.sendCommand = (
    command: { name: string; args: unknown[]; promise: Promise<unknown> },
    ...rest: unknown[]
  ) => {
    if (counting()) {
      if (outstanding === 0) open = true;
      outstanding++;
      counts.commands.push(command.name);
      const script = command.name === 'evalsha' || command.name === 'eval';
      const first = command.args[script ? 2 : 0];
      counts.sent.push({
        name: command.name,
        first: typeof first === 'string' ? first : Buffer.isBuffer(first) ? first.toString() : '',
        trip: counts.trips,
      });
      const done = () => {
        outstanding--;
        if (outstanding === 0 && open) {
          open = false;
          counts.trips++;
        }
      };
      command.promise.then(done, done);
    }
    return (send as (...args: unknown[]) => unknown)(command, ...rest);
  };
  return counts;
}
