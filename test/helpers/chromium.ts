import { chromium, type Browser } from 'playwright-core';

/**
 * The machine's headless Chromium (Debian's `/usr/bin/chromium`, not a browser build of
 * Playwright's own, which cannot be downloaded here), quiet: no sandbox, GPU, background
 * networking, component updates or first-run pages.
 */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--no-first-run',
    ],
  });
}
