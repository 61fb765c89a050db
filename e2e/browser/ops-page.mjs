// Drives a service's /ops page in headless Chromium, as an operator would: sees the dead letter
// in the counts and the test's traffic in the charts, is refused with a wrong token (a refusal
// answered late, after the next token's list, changes nothing; replies slower than the
// refreshes are drawn all the same); with the read-only token sees the dead letter but is
// refused its action; types the admin token, finds the two dead letters' group by cause and
// shows them, clicks the action on one, sees it leave the list and the action in the audit log
// (having opened its details, which must show EXPECT_DETAIL and nothing before they are
// loaded, and confirmed a skip); then, with BULK_ACTION set, filters the list
// (FILTER_KEY=FILTER_VALUE), takes that action on every match with one click, is shown how
// many and which first before confirming, and sees the list empty; before that, a filter value
// the service refuses leaves the filters applied before in the form and the list; with
// WIDER_GROUP set, "Show" on the group of items with no type says why the list may show more
// than the group (WIDER_GROUP, the reason's start). The Rust test that starts this checks the
// effects (published, skipped) in the database and on the stream.
//
//   OPS_URL=http://127.0.0.1:8080 ADMIN_TOKEN=… READ_TOKEN=… DEAD_ID=… ACTION=retry EXPECT_DETAIL=… \
//     [BULK_ACTION=retry FILTER_KEY=errorContains FILTER_VALUE=size] [WIDER_GROUP=…] \
//     [SCREENSHOT=x.png] \
//     node ops-page.mjs
import { launch, waitForTile } from "./browser.mjs";

const { OPS_URL, ADMIN_TOKEN, READ_TOKEN, DEAD_ID, ACTION, SCREENSHOT, EXPECT_DETAIL } = process.env;
const { BULK_ACTION, FILTER_KEY, FILTER_VALUE, EXPECT_BROKER, WIDER_GROUP } = process.env;
const TIMEOUT = 20_000;
// A value the "since" filter refuses.
const REFUSED_SINCE = "yesterday";

const browser = await launch();
const problems = [];
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(TIMEOUT);
  // A CSP violation or a script error shows up as a console error.
  page.on("console", (message) => {
    if (message.type() !== "error") return;
    // The filter refused on purpose below: refreshes sent with it may log their 422s late.
    if (message.location().url.includes(`since=${REFUSED_SINCE}`)) return;
    // The wrong token's refusals, logged as they come, some after the next token is in use:
    // what the page makes of them is checked by what it shows.
    if (message.text().includes("status of 401")) return;
    problems.push(`console: ${message.text()}`);
  });
  page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
  page.on("requestfailed", (request) => problems.push(`request failed: ${request.url()}`));

  // A skip asks first, since it cannot be undone.
  const acceptSkipQuestion = () => {
    if (ACTION !== "skip") return;
    page.once("dialog", (dialog) => {
      if (!/given up for good/.test(dialog.message())) {
        problems.push(`an unexpected question: ${dialog.message()}`);
      }
      dialog.accept();
    });
  };

  await page.goto(`${OPS_URL}/ops`);
  await page.waitForFunction(
    () => Number(document.getElementById("stat-dead")?.textContent) >= 1);
  // The broker's tile (orders-service, whose relay runs beside the page): its state, not
  // highlighted while it is "ok".
  if (EXPECT_BROKER) await waitForTile(page, "broker", EXPECT_BROKER, EXPECT_BROKER !== "ok");
  // The charts draw lines of at least two samples, and the traffic of the test shows in one.
  await page.waitForFunction(() =>
    [...document.querySelectorAll("#charts path.line")].some((p) => p.getAttribute("d").includes("L"))
    && [...document.querySelectorAll("#charts figure")].some((f) => Number(f.dataset.max) > 0));

  // Resolves at the next redraw of the dead letters' list.
  const listRedrawn = () => page.evaluate((timeout) => new Promise((redrawn, fail) => {
    const observer = new MutationObserver(() => {
      observer.disconnect();
      redrawn();
    });
    observer.observe(document.getElementById("dead-rows"), { childList: true });
    setTimeout(() => {
      observer.disconnect();
      fail(new Error("the list of dead letters was not redrawn"));
    }, timeout);
  }), TIMEOUT);

  await page.fill("#token", "not-the-token");
  await page.click("#use-token");
  await page.waitForSelector("#status.bad >> text=the token was refused");

  // A wrong token's refusal that comes late, after the next token's list is drawn, changes
  // nothing: the page keeps the new token and refreshes on.
  let lateRefusal = null;
  let answerLate;
  const answered = new Promise((resolve) => { answerLate = resolve; });
  const listUrl = (url) => url.pathname.endsWith("/dead");
  await page.route(listUrl, async (route) => {
    if (lateRefusal || route.request().headers().authorization !== "Bearer not-the-token") {
      await route.fallback();
      return;
    }
    lateRefusal = route.request();
    await answered;
    await route.continue();
  });
  await page.fill("#token", "not-the-token");
  const lateSent = page.waitForRequest((request) => request.url().includes("/dead?"));
  await page.click("#use-token");
  await lateSent;
  const row = page.locator(`tr[data-id="${DEAD_ID}"]`);
  await page.fill("#token", READ_TOKEN);
  await page.click("#use-token");
  await row.waitFor();
  const refusalRead = page.waitForResponse((response) => response.request() === lateRefusal);
  answerLate();
  await refusalRead;
  await listRedrawn();
  await page.unroute(listUrl);
  if ((await page.textContent("#status")).includes("refused")) {
    problems.push(`a late refusal of a token replaced since: ${await page.textContent("#status")}`);
  }

  // Replies slower than the refreshes are drawn all the same: each list request is answered
  // only once the next one has been sent.
  let slow = null;
  let holding = true;
  let firstHeld;
  const held = new Promise((resolve) => { firstHeld = resolve; });
  await page.route(listUrl, async (route) => {
    if (!holding) {
      await route.fallback();
      return;
    }
    const earlier = slow;
    slow = route;
    firstHeld();
    await earlier?.continue();
  });
  // From the first request held on: a reply to one sent before it is not the latest either.
  await held;
  await listRedrawn();
  holding = false;
  await slow.continue();
  await page.unroute(listUrl);

  acceptSkipQuestion();
  await row.locator(`button[data-action="${ACTION}"]`).click();
  await page.waitForSelector("#status.bad >> text=may read, not act");
  await row.waitFor();
  // The refusal was expected (Chromium logs the 403 as an error); what came before stays.
  problems.splice(0, problems.length,
    ...problems.filter((problem) => !problem.includes("status of 403")));

  await page.fill("#token", ADMIN_TOKEN);
  await page.click("#use-token");
  await row.waitFor();
  // Both dead items failed alike: one group of two, and its "Show" filters the list to them.
  const group = page.locator("#groups-rows tr").first();
  await group.waitFor();
  if ((await group.locator("td").first().textContent()) !== "2") {
    problems.push(`the first group: ${await group.textContent()}`);
  }
  await group.locator("button").click();
  await page.waitForSelector("#dead-summary >> text=2 dead letter(s)");
  if ((await page.textContent("#status")).includes("more than this group")) {
    problems.push(`a group the filters name exactly: ${await page.textContent("#status")}`);
  }
  // Its details show what it carried, and stay open across the page's refreshes. Their answer
  // is held until the list has been redrawn: a slow answer must not show them half.
  const detailPath = `/${encodeURIComponent(DEAD_ID)}`;
  const detail = page.locator(`tr[data-detail-of="${DEAD_ID}"] pre`);
  await page.route((url) => url.pathname.endsWith(detailPath), async (route) => {
    try {
      await listRedrawn();
      for (const shown of await detail.allTextContents()) {
        problems.push(`details shown before they were loaded: ${shown}`);
      }
    } catch (error) {
      problems.push(`while the details were held: ${error.message}`);
    } finally {
      await route.continue();
    }
  }, { times: 1 });
  await row.locator("button.details").click();
  await detail.waitFor();
  if (!(await detail.textContent()).includes(EXPECT_DETAIL)) {
    problems.push(`the details lack ${EXPECT_DETAIL}: ${await detail.textContent()}`);
  }
  await listRedrawn();
  if ((await detail.count()) === 0) problems.push("the details closed on a refresh");
  if (SCREENSHOT) {
    await page.screenshot({ path: SCREENSHOT.replace(/\.png$/, "-detail.png"), fullPage: true });
  }
  acceptSkipQuestion();
  await row.locator(`button[data-action="${ACTION}"]`).click();
  await page.waitForSelector(`#status.good >> text=${DEAD_ID}`);
  await row.waitFor({ state: "detached" });
  await page.waitForSelector(`#audit-rows >> text=${DEAD_ID}`);

  if (BULK_ACTION) {
    // A filter value the service refuses puts the accepted filters back in the form, so that
    // a bulk action never covers more than the form shows.
    await page.fill("#filter-since", REFUSED_SINCE);
    await page.click("#apply-filters");
    await page.waitForSelector("#status.bad >> text=Filter refused");
    if ((await page.inputValue("#filter-since")) !== "") {
      problems.push(`a refused filter stays in the form: ${await page.inputValue("#filter-since")}`);
    }
    if (FILTER_KEY) {
      await page.fill(`#filter-${FILTER_KEY}`, FILTER_VALUE);
      await page.click("#apply-filters");
    }
    await page.locator("#dead-rows tr").first().waitFor();
    page.once("dialog", (dialog) => {
      if (!/1 dead letter\(s\) .*\nFirst: \S+/s.test(dialog.message())) {
        problems.push(`the bulk action's preview: ${dialog.message()}`);
      }
      dialog.accept();
    });
    await page.click(`button[data-bulk="${BULK_ACTION}"]`);
    await page.waitForSelector("#status.good >> text=all: 1 done");
    await page.waitForSelector("#dead-summary >> text=No dead letters match the filters.");
    await page.waitForSelector(`#audit-rows >> text=${FILTER_VALUE}`);
  }
  if (WIDER_GROUP) {
    // A group of items with no type: the filters cannot name it, and "Show" says so.
    const wide = page.locator("#groups-rows tr", { has: page.locator("td:nth-child(2)", { hasText: /^–$/ }) });
    await wide.locator("button").click();
    await page.waitForSelector(`#status >> text=more than this group: ${WIDER_GROUP}`);
  }
  if (SCREENSHOT) await page.screenshot({ path: SCREENSHOT, fullPage: true });
} catch (error) {
  problems.push(error.message);
} finally {
  await browser.close();
}
if (problems.length > 0) {
  console.error(problems.join("\n"));
  process.exit(1);
}
console.log(`ops page: ${ACTION} on ${DEAD_ID} done${BULK_ACTION ? `, then ${BULK_ACTION} on all` : ""}`);
