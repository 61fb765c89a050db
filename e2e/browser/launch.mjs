// Headless Chromium for the browser tests: Debian's (or CHROMIUM_PATH's), quiet and offline.
import { chromium } from "playwright-core";

export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM_PATH || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
      "--disable-default-apps", "--disable-sync", "--no-first-run"],
  });
}
