"""Headless Chromium on the page of `attnlab serve`: Selenium with Debian's `chromium` and
`chromium-driver` (`make test` installs them where it can). The browser test uses it, and it makes
the README's screenshot, reproducibly (the same seed gives the same completion):

    python tests/serve/browser.py runs/shakespeare-char-cpu --out docs/serve.png
"""

import argparse
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# No GPU, no sandbox (containers run as root), nothing fetched from the network behind our back.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def missing() -> str | None:
    """Why the browser cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).exists() and not shutil.which(Path(path).name):
            return f"{path} is not installed (Debian's {package} package; `make test` installs it as root)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator:
    """A headless Chromium with a fresh profile, driven by Selenium; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="attnlab-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or CHROMIUM
        for flag in [*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]:
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, for the test
        service = Service(shutil.which("chromedriver") or CHROMEDRIVER)
        driver = webdriver.Chrome(service=service, options=options)
        try:
            yield driver
        finally:
            driver.quit()


def wait(driver, condition: Callable, timeout: float = 30.0):
    """condition(driver)'s first truthy value, polled every 20 ms."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.02).until(lambda d: condition(d))


def by_id(driver, element_id: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def fill(driver, element_id: str, text: str) -> None:
    field = by_id(driver, element_id)
    field.clear()
    field.send_keys(text)


def open_page(driver, url: str, n_models: int) -> None:
    """Load the page and wait until its model picker lists the server's models."""
    from selenium.webdriver.common.by import By

    driver.get(url + "/")
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#model option")) == n_models)


def pick_option(driver, select_id: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(by_id(driver, select_id)).select_by_value(value)


def pick_model(driver, name: str) -> None:
    pick_option(driver, "model", name)


# What the page sends: a wrapper of window.fetch, put in by the test after the page has loaded
# (WebDriver's scripts are not the page's own: the Content-Security-Policy does not apply to them).
RECORD = """
const sent = (window.sentBodies = []), fetch0 = window.fetch;
window.fetch = (url, options) => {
  if (options && options.body) sent.push([String(url), JSON.parse(options.body)]);
  return fetch0(url, options);
};
"""


def record_requests(driver) -> None:
    """From now on, keep the JSON body of every request the page sends (read back by `sent`)."""
    driver.execute_script(RECORD)


def sent(driver, path: str) -> list[dict]:
    """The JSON bodies the page has sent to `path` since `record_requests`, oldest first."""
    return [body for url, body in driver.execute_script("return window.sentBodies") if url == path]


def completion(driver) -> tuple[str, str, int]:
    """The page's completion: (state "running" or "idle", the generated text, pieces received)."""
    out = by_id(driver, "completion")
    generated = driver.execute_script("return arguments[0].querySelector('.generated').textContent", out)
    return out.get_attribute("data-state") or "", generated, int(out.get_attribute("data-pieces") or 0)


def full_page_screenshot(driver, path: Path) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(driver.get_window_size()["width"], height + 100)
    driver.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.2)
    driver.save_screenshot(str(path))


def main() -> None:
    from attnlab.serve.app import create_app
    from attnlab.serve.registry import load_runs
    from attnlab.serve.server import BackgroundServer

    parser = argparse.ArgumentParser(description="Screenshot of the attnlab serve page after a completion.")
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run folders (NAME=PATH); the first is shown")
    parser.add_argument("--out", type=Path, default=Path("docs/serve.png"))
    parser.add_argument("--prompt", default="ROMEO:\nWhat light through yonder window breaks?\n")
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if reason := missing():
        raise SystemExit(reason)
    runs = load_runs(args.runs)
    with BackgroundServer(create_app(runs)) as server, chromium(width=1200, height=900) as driver:
        open_page(driver, server.url, len(runs))
        fill(driver, "prompt", args.prompt)
        fill(driver, "max-tokens", str(args.max_tokens))
        fill(driver, "seed", str(args.seed))
        by_id(driver, "generate").click()
        wait(driver, lambda d: completion(d)[0] == "idle" and completion(d)[2] > 0, timeout=300)
        by_id(driver, "show-attention").click()
        wait(driver, lambda d: d.execute_script("return !!document.querySelector('#attention-box table')"))
        full_page_screenshot(driver, args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
