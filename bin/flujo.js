#!/usr/bin/env node
// The `flujo` command. Runs the compiled CLI (built by `npm run build`, which `npm ci` runs).
import { main } from '../dist/cli/main.js';

process.exitCode = main(process.argv.slice(2));
