// Loads a service's /ops page in headless Chromium and waits for one tile of its counts to show
// VALUE, highlighted (ALERT=true) or not.
//
//   OPS_URL=http://127.0.0.1:8080 KEY=broker VALUE="storage full" ALERT=true [SCREENSHOT=x.png] \
//     node ops-tile.mjs
import { launch, waitForTile } from "./browser.mjs";

const { OPS_URL, KEY, VALUE, ALERT, SCREENSHOT } = process.env;

const browser = await launch();
const problems = [];
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(20_000);
  page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
  await page.goto(`${OPS_URL}/ops`);
  await waitForTile(page, KEY, VALUE, ALERT === "true");
  if (SCREENSHOT) await page.screenshot({ path: SCREENSHOT });
} catch (error) {
  problems.push(error.message);
} finally {
  await browser.close();
}
if (problems.length > 0) {
  console.error(problems.join("\n"));
  process.exit(1);
}
console.log(`ops page: ${KEY} shows ${VALUE}`);
