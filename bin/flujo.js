#!/usr/bin/env node
// The `flujo` command. Runs the compiled CLI (built by `npm run build`, which `npm ci` runs).
import { setTimeout } from 'node:timers';
import { main } from '../dist/cli/main.js';

// A closed pipe (`flujo run … | head -1`) must not kill a command that drives a run.
for (const stream of [process.stdout, process.stderr]) {
  stream.on('error', (error) => {
    if (error.code !== 'EPIPE') throw error;
  });
}
process.exitCode = await main(process.argv.slice(2));
// A connection that is still closing must not hold the exit up.
setTimeout(() => process.exit(), 250).unref();
