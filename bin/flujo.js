#!/usr/bin/env node
// The `flujo` command. Runs the compiled CLI (built by `npm run build`, which `npm ci` runs).
// Written so that an old Node parses it and says which version it needs, before loading anything.
'use strict';

var NEEDED = [22, 12];
var parts = process.versions.node.split('.');
var major = Number(parts[0]);
var minor = Number(parts[1]);
// `flujo init` (which gives a new project Node 24), --help and --version also run on Node 20, so
// that a machine's old Node can still set a project up; every other command needs NEEDED.
var command = process.argv[2];
var setUpOnly =
  command === 'init' || command === '--help' || command === '-h' || command === '--version';
var old = major < NEEDED[0] || (major === NEEDED[0] && minor < NEEDED[1]);
if (old && !(setUpOnly && major >= 20)) {
  process.stderr.write(
    'flujo: this is Node ' +
      process.versions.node +
      ' (' +
      process.execPath +
      '); flujo needs Node ' +
      NEEDED.join('.') +
      ' or newer (Node 24 recommended).\n' +
      'Fix, in your project (the folder with package.json):\n' +
      '  npm pkg set allowScripts.node=true --json && npm install -D node@24\n' +
      'then run flujo as npx flujo … (or in npm scripts, npm run …): npm puts the Node of\n' +
      'node_modules/.bin first on PATH for them. (flujo init adds that devDependency itself.)\n' +
      'Or install Node 24 for the whole machine: from https://nodejs.org, or with a version\n' +
      'manager (e.g. `nvm install 24 && nvm use 24`); then run the command again.\n',
  );
  process.exit(2);
}

// A closed pipe (`flujo run … | head -1`) must not kill a command that drives a run.
[process.stdout, process.stderr].forEach(function (stream) {
  stream.on('error', function (error) {
    if (error.code !== 'EPIPE') throw error;
  });
});

import('../dist/cli/main.js').then(function (cli) {
  return cli.main(process.argv.slice(2)).then(function (code) {
    process.exitCode = code;
    // A connection that is still closing must not hold the exit up; but what is still being written
    // to a pipe (a large `--json` report) is written whole first: the timer starts once both
    // streams have flushed what came before.
    var flushed = 0;
    function whenFlushed() {
      flushed += 1;
      if (flushed < 2) return;
      globalThis
        .setTimeout(function () {
          process.exit();
        }, 250)
        .unref();
    }
    process.stdout.write('', whenFlushed);
    process.stderr.write('', whenFlushed);
  });
});
