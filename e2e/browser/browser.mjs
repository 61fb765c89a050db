// What the browser tests share: headless Chromium (Debian's, or CHROMIUM_PATH's), quiet and
// offline, and the wait for a tile of /ops's counts.
import { chromium } from "playwright-core";

export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM_PATH || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
      "--disable-default-apps", "--disable-sync", "--no-first-run"],
  });
}

// Waits until /ops's tile `key` shows `value`, highlighted or not as `alert` says.
export function waitForTile(page, key, value, alert) {
  return page.waitForFunction(([key, value, alert]) => {
    const shown = document.getElementById(`stat-${key}`);
    return shown?.textContent === value
      && shown.parentElement.classList.contains("alert") === alert;
  }, [key, value, alert]);
}
