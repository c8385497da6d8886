"""The page in a real headless Chromium against a live server: type a prompt, see the tokens stream
in, press Stop (the server stops decoding), switch models (translation, classifier, tagger), open
the attention explorer, take a screenshot."""

import time

import pytest

from serve.browser import by_id, chromium, completion, fill, missing, open_page, pick_model, wait
from serve.conftest import RUNS, lm_worker

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing() is not None, reason=missing() or "")]


def count(driver, selector: str) -> int:
    return driver.execute_script("return document.querySelectorAll(arguments[0]).length", selector)


def test_the_page_streams_stops_and_switches_models(live, tmp_path):
    worker = lm_worker(live)
    with chromium() as driver:
        open_page(driver, live.url, len(RUNS))
        assert by_id(driver, "lm-view").is_displayed() and not by_id(driver, "mt-view").is_displayed()

        # Tokens stream in: the text grows while the generation runs.
        fill(driver, "prompt", "ROMEO:\n")
        fill(driver, "max-tokens", "50000")
        by_id(driver, "generate").click()
        seen = wait(driver, lambda d: completion(d)[2] >= 3 and completion(d))
        assert seen[0] == "running" and seen[1]
        later = wait(driver, lambda d: completion(d)[2] > seen[2] + 10 and completion(d))
        assert later[0] == "running" and later[1].startswith(seen[1]) and len(later[1]) > len(seen[1])
        assert worker.stats()["active"] == 1

        # Stop aborts the fetch; the server stops decoding for it.
        by_id(driver, "stop").click()
        wait(driver, lambda d: completion(d)[0] == "idle")
        assert by_id(driver, "completion").get_attribute("data-finish") == "stopped"
        assert "stopped after" in by_id(driver, "lm-status").text
        wait(driver, lambda d: worker.stats()["active"] == 0, timeout=5)
        generated = worker.stats()["generated_tokens"]
        time.sleep(0.3)
        assert worker.stats()["generated_tokens"] == generated
        assert len(completion(driver)[1]) < 50000

        # The attention explorer of `attnlab attention` on the prompt: 7 tokens, one header row.
        by_id(driver, "show-attention").click()
        wait(driver, lambda d: count(d, "#attention-box .attn-grid tr") == 8)
        assert count(driver, "#attention-box .attn-layer option") == 2

        # Another model, another view: a translation and its heatmap.
        pick_model(driver, "mt")
        assert by_id(driver, "mt-view").is_displayed() and not by_id(driver, "lm-view").is_displayed()
        by_id(driver, "translate").click()
        wait(driver, lambda d: by_id(d, "mt-result").is_displayed())
        assert by_id(driver, "translation").text
        assert int(by_id(driver, "heatmap").get_attribute("width")) > 100

        # A classifier: one probability bar per label; a tagger: one chip per word.
        pick_model(driver, "sst")
        by_id(driver, "enc-run").click()
        wait(driver, lambda d: count(d, "#enc-result .bar-row") == 2)
        pick_model(driver, "pos")
        assert by_id(driver, "enc-run").text == "Tag"
        fill(driver, "enc-input", "The cat can't sit.")
        by_id(driver, "enc-run").click()
        wait(driver, lambda d: count(d, "#enc-result .word") == 6)

        # A masked language model shows its attention only: the text box, no button of its own.
        pick_model(driver, "mlm")
        assert by_id(driver, "enc-view").is_displayed() and not by_id(driver, "enc-run").is_displayed()
        fill(driver, "enc-input", "the game is on .")
        by_id(driver, "show-attention").click()
        wait(driver, lambda d: count(d, "#attention-box .attn-grid tr") > 4)

        shot = tmp_path / "serve.png"
        driver.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors


def test_with_an_api_key_the_page_asks_for_it(runs):
    from attnlab.serve.app import create_app
    from attnlab.serve.server import BackgroundServer

    with BackgroundServer(create_app(runs, api_key="k3y")) as server, chromium(width=420, height=900) as driver:
        driver.get(server.url + "/")
        wait(driver, lambda d: by_id(d, "key-panel").is_displayed())
        assert "Authorization: Bearer KEY" in by_id(driver, "error").text
        fill(driver, "api-key", "k3y")
        by_id(driver, "key-form").submit()
        wait(driver, lambda d: count(d, "#model option") == len(RUNS))
        assert not by_id(driver, "key-panel").is_displayed() and not by_id(driver, "error").is_displayed()
        fill(driver, "max-tokens", "20")
        by_id(driver, "generate").click()
        wait(driver, lambda d: completion(d)[0] == "idle" and completion(d)[2] > 0)
        assert "tokens in" in by_id(driver, "lm-status").text
        # A narrow window (headless Chromium's narrowest is 500 px): nothing sticks out sideways.
        width, inner = driver.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert width <= inner
