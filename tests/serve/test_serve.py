#!/usr/bin/env python3
"""dstrain serve against real HTTP clients (Python's http.client and curl) on the loopback.

A tiny model trained to memorise a sentence is served; its answers are checked against
`dstrain generate` (greedy text) and `dstrain eval` (the prompt's log-probabilities), sent alone
and by 32 clients at once, streamed, cut by stop strings, refused when the queue is full, refused
when malformed, and drained by SIGTERM. Usage: test_serve.py DSTRAIN WORK_DIR
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

DSTRAIN, WORK = sys.argv[1], sys.argv[2]
TEXT = "the quick brown fox jumps over the lazy dog; "
CONTEXT = 64  # the model's max_seq_len (input/tiny.ini)


def run(*args):
    done = subprocess.run([DSTRAIN, *args], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"dstrain {' '.join(args)} failed: {done.stdout}{done.stderr}")
    return done


def memoriser():
    """The checkpoint directory of a tiny model that has learnt TEXT (trained once)."""
    if os.path.isdir(f"{WORK}/run/checkpoints"):
        return f"{WORK}/run/checkpoints"
    os.makedirs(WORK, exist_ok=True)
    with open(f"{WORK}/fox.txt", "w") as f:
        f.write(TEXT * 200)
    run("prep", "--input", f"{WORK}/fox.txt", "--output", f"{WORK}/fox.h5")
    run("train", "--config", os.path.join(os.path.dirname(__file__), "../../input/tiny.ini"), "--run.dir",
        f"{WORK}/run", "--data.train", f"{WORK}/fox.h5", "--train.device", "cpu", "--train.steps", "150",
        "--train.global_batch", "4", "--train.micro_batch", "1", "--train.seq_len", "64", "--optim.lr", "1e-2",
        "--optim.min_lr", "1e-3", "--log.interval", "50", "--ckpt.interval", "150")
    return f"{WORK}/run/checkpoints"


def long_context_model():
    """A checkpoint whose model reads 1,024 positions (two steps of training): its completions take
    long enough on the CPU to be in flight when a test acts."""
    if not os.path.isdir(f"{WORK}/long/checkpoints"):
        memoriser()
        run("train", "--config", os.path.join(os.path.dirname(__file__), "../../input/tiny.ini"), "--run.dir",
            f"{WORK}/long", "--data.train", f"{WORK}/fox.h5", "--train.device", "cpu", "--train.steps", "2",
            "--train.global_batch", "1", "--train.micro_batch", "1", "--train.seq_len", "64",
            "--model.max_seq_len", "1024", "--ckpt.interval", "2")
    return f"{WORK}/long/checkpoints"


def open_stream(port, body):
    """A streamed completion whose first event has arrived: (connection, response)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    connection.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)))
    response = connection.getresponse()
    assert response.status == 200
    first = response.readline()
    assert first.startswith(b"data: "), first
    return connection, response, first


class Server:
    """dstrain serve as a child process on a free port; ended by its pid."""

    def __init__(self, ckpt, *options):
        self.log = open(f"{WORK}/serve-{time.time_ns()}.log", "w+")
        self.process = subprocess.Popen([DSTRAIN, "serve", "--ckpt", ckpt, "--port", "0", "--device", "cpu",
                                         *options], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        self.port = None
        while self.port is None:
            if time.time() > deadline or self.process.poll() is not None:
                raise AssertionError("serve did not start: " + self.output())
            for line in self.output().splitlines():
                if " on http://127.0.0.1:" in line:
                    self.port = int(line.split(" on http://127.0.0.1:")[1].split()[0])
            time.sleep(0.05)

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def request(self, method, path, body=None, timeout=120):
        """(status, headers, parsed JSON or raw text)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (str, bytes)) or body is None else json.dumps(body)
        connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read().decode("utf-8", "replace")
        connection.close()
        try:
            return response.status, dict(response.getheaders()), json.loads(raw)
        except ValueError:
            return response.status, dict(response.getheaders()), raw

    def complete(self, body):
        status, _, answer = self.request("POST", "/v1/completions", body)
        assert status == 200, (status, answer)
        return answer

    def stream(self, body):
        """The data of each server-sent event, in order."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        connection.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)))
        response = connection.getresponse()
        assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
        events = [line[len("data: "):] for line in response.read().decode().split("\n\n") if line]
        connection.close()
        return events

    def stop(self):
        """SIGTERM; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.log.close()


def greedy(prompt, max_tokens=30, **extra):
    return dict({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}, **extra)


class Serve(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ckpt = memoriser()
        cls.server = Server(cls.ckpt, "--max-batch", "8", "--body-limit", "65536", "--max-tokens-limit", "200")

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, cls.server.output()

    def assertAnswers(self):
        status, _, answer = self.server.request("GET", "/health")
        self.assertEqual((status, answer["status"]), (200, "ok"))

    def test_health_and_models(self):
        self.assertAnswers()
        status, _, models = self.server.request("GET", "/v1/models")
        self.assertEqual(status, 200)
        model = models["data"][0]
        self.assertEqual((model["id"], model["step"], model["max_model_len"], model["vocab_size"]), ("run", 150, 64, 264))

    def test_greedy_completion_equals_generate(self):
        for prompt, tokens in [("the quick", 40), ("lazy", 25), ("jumps over", 30)]:
            generated = run("generate", "--ckpt", self.ckpt, "--prompt", prompt, "--temperature", "0",
                            "--max-new-tokens", str(tokens), "--device", "cpu").stdout
            answer = self.server.complete(greedy(prompt, tokens))
            self.assertEqual(prompt + answer["choices"][0]["text"] + "\n", generated)
            self.assertEqual(answer["choices"][0]["finish_reason"], "length")
            self.assertEqual(answer["usage"], {"prompt_tokens": len(prompt), "completion_tokens": tokens,
                                               "total_tokens": len(prompt) + tokens})

    def test_curl_completion_and_stream(self):
        url = f"http://127.0.0.1:{self.server.port}/v1/completions"
        body = json.dumps(greedy("the quick", 20))
        whole = json.loads(subprocess.run(["curl", "-sS", "-H", "Content-Type: application/json", "-d", body, url],
                                          capture_output=True, text=True, check=True).stdout)
        self.assertEqual(whole["choices"][0]["text"], " brown fox jumps ove")
        streamed = subprocess.run(["curl", "-sSN", "-d", json.dumps(greedy("the quick", 20, stream=True)), url],
                                  capture_output=True, text=True, check=True).stdout
        events = [e[len("data: "):] for e in streamed.split("\n\n") if e]
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual("".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]), " brown fox jumps ove")

    def test_echo_logprobs_equal_eval(self):
        # dstrain eval's first window of the corpus: 33 tokens (bytes), 32 predictions.
        run("eval", "--ckpt", self.ckpt, "--data", f"{WORK}/fox.h5", "--batches", "1", "--train.global_batch", "1",
            "--train.micro_batch", "1", "--train.seq_len", "32", "--json", f"{WORK}/eval.json")
        with open(f"{WORK}/eval.json") as f:
            loss = json.load(f)["loss"]
        ids = list(TEXT.encode()[:33])
        answer = self.server.complete({"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 3})
        choice = answer["choices"][0]
        self.assertEqual(choice["text"], TEXT[:33])
        logprobs = choice["logprobs"]
        self.assertEqual(logprobs["tokens"], list(TEXT[:33]))
        self.assertEqual(logprobs["text_offset"], list(range(33)))
        self.assertIsNone(logprobs["token_logprobs"][0])
        self.assertIsNone(logprobs["top_logprobs"][0])
        self.assertAlmostEqual(-sum(logprobs["token_logprobs"][1:]) / 32, loss, delta=1e-5)
        for token, own, top in zip(logprobs["tokens"][1:], logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:]):
            self.assertLessEqual(len(top), 3)
            self.assertGreaterEqual(max(top.values()), own)
            if token in top:
                self.assertAlmostEqual(top[token], own, delta=1e-9)
        self.assertEqual(choice["finish_reason"], "length")
        self.assertEqual(answer["usage"]["completion_tokens"], 0)

    def test_stream_delivers_the_same_text_in_pieces(self):
        body = greedy("the quick", 50, logprobs=1)
        whole = self.server.complete(body)["choices"][0]
        events = self.server.stream(body)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
        self.assertGreater(len(chunks), 10)
        self.assertEqual("".join(c["text"] for c in chunks), whole["text"])
        self.assertEqual([t for c in chunks for t in c["logprobs"]["tokens"]], whole["logprobs"]["tokens"])
        self.assertEqual([c["finish_reason"] for c in chunks], [None] * (len(chunks) - 1) + ["length"])

    def test_stop_strings_end_the_completion(self):
        for body in (greedy("the quick", 60, stop="lazy"), greedy("the quick", 60, stop=["zzz", " over"])):
            full = self.server.complete(greedy("the quick", 60))["choices"][0]["text"]
            stop = body["stop"] if isinstance(body["stop"], str) else " over"
            choice = self.server.complete(body)["choices"][0]
            self.assertEqual(choice["text"], full[:full.index(stop)])
            self.assertEqual(choice["finish_reason"], "stop")
            events = self.server.stream(body)
            self.assertEqual("".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]), choice["text"])

    def test_a_list_of_prompts_gives_a_choice_each(self):
        answer = self.server.complete(greedy(["the quick", [ord(c) for c in "lazy"]], 12))
        texts = [c["text"] for c in sorted(answer["choices"], key=lambda c: c["index"])]
        self.assertEqual(texts, [self.server.complete(greedy("the quick", 12))["choices"][0]["text"],
                                 self.server.complete(greedy("lazy", 12))["choices"][0]["text"]])

    def test_seeded_sampling_repeats(self):
        body = {"prompt": "the", "max_tokens": 30, "temperature": 1.5, "top_k": 20, "top_p": 0.95, "seed": 7}
        self.assertEqual(self.server.complete(body)["choices"][0]["text"], self.server.complete(body)["choices"][0]["text"])

    def test_32_concurrent_clients_get_what_each_gets_alone(self):
        requests = [greedy(TEXT[i % 40: i % 40 + 3 + i % 7], 10 + (i * 7) % 40) for i in range(32)]
        alone = [self.server.complete(r)["choices"][0]["text"] for r in requests]
        results = [None] * 32

        def client(i):
            results[i] = self.server.complete(requests[i])["choices"][0]["text"]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        self.assertEqual(results, alone)

    def test_malformed_requests_get_json_errors_and_the_server_goes_on(self):
        too_long = list(range(1, 101))  # 100 tokens: the context is 64
        bad = [
            "{not json", "[1, 2]", "null", '"text"', {}, {"prompt": 5}, {"prompt": ""}, {"prompt": []},
            {"prompt": [True]}, {"prompt": [300]}, {"prompt": [-1]}, {"prompt": [[]]}, {"prompt": [{"a": 1}]},
            {"prompt": too_long}, {"prompt": "a", "max_tokens": 10 ** 9}, {"prompt": "a", "max_tokens": -1},
            {"prompt": "a", "max_tokens": 2.5}, {"prompt": "a", "temperature": -0.5},
            {"prompt": "a", "temperature": "hot"}, {"prompt": "a", "top_p": 0}, {"prompt": "a", "top_p": 1.5},
            {"prompt": "a", "top_k": -5}, {"prompt": "a", "logprobs": 100}, {"prompt": "a", "logprobs": True},
            {"prompt": "a", "echo": "yes"}, {"prompt": "a", "stop": 5}, {"prompt": "a", "stop": ["a"] * 5},
            {"prompt": "a", "n": 2}, {"prompt": "a", "seed": -1},
        ]
        self.assertEqual(len(bad), 29)
        for body in bad:
            status, _, answer = self.server.request("POST", "/v1/completions", body)
            self.assertEqual(status, 400, body)
            self.assertIn("message", answer["error"], body)
            self.assertEqual(answer["error"]["type"], "invalid_request_error")
            self.assertAnswers()
        # The 30th: a body over --body-limit (64 KiB).
        status, _, answer = self.server.request("POST", "/v1/completions", {"prompt": "a" * 100000})
        self.assertEqual(status, 413)
        self.assertIn("limit", answer["error"]["message"])
        # Not HTTP at all, a request cut off mid-body, a stream whose client hangs up.
        with socket.create_connection(("127.0.0.1", self.server.port)) as s:
            s.sendall(b"HELLO THERE\r\n\r\n")
            s.settimeout(10)
            self.assertIn(b"400", s.recv(4096))
        with socket.create_connection(("127.0.0.1", self.server.port)) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\"")
        with socket.create_connection(("127.0.0.1", self.server.port)) as s:
            body = json.dumps(greedy("the", 150, stream=True)).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            s.recv(100)
        status, _, _ = self.server.request("GET", "/v1/nothing")
        self.assertEqual(status, 404)
        status, _, _ = self.server.request("GET", "/v1/completions")
        self.assertEqual(status, 405)
        self.assertAnswers()
        self.assertEqual(self.server.complete(greedy("the quick", 20))["choices"][0]["text"], " brown fox jumps ove")


class Overload(unittest.TestCase):
    def test_a_full_queue_answers_503_and_nothing_else_breaks(self):
        server = Server(memoriser(), "--max-batch", "1", "--max-queue", "4")
        try:
            body = greedy("the quick", 60)
            alone = server.complete(body)["choices"][0]["text"]
            answers = [None] * 32

            def client(i):
                answers[i] = server.request("POST", "/v1/completions", body)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
            refused = [a for a in answers if a[0] == 503]
            served = [a for a in answers if a[0] == 200]
            self.assertEqual(len(refused) + len(served), 32, [a[0] for a in answers])
            self.assertGreater(len(refused), 0)
            self.assertGreaterEqual(len(served), 4)
            for status, headers, answer in refused:
                self.assertEqual(headers.get("Retry-After"), "1")
                self.assertIn("queue", answer["error"]["message"])
            for status, headers, answer in served:
                self.assertEqual(answer["choices"][0]["text"], alone)
            self.assertEqual(server.complete(body)["choices"][0]["text"], alone)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_sigterm_lets_requests_in_flight_finish_and_exits_0(self):
        server = Server(long_context_model())
        body = greedy("the quick", 1000)
        alone = server.complete(body)["choices"][0]["text"]
        connection, response, first = open_stream(server.port, body)
        server.process.send_signal(signal.SIGTERM)  # while the completion decodes
        rest = (first + response.read()).decode()
        connection.close()
        self.assertEqual(server.stop(), 0, server.output())
        events = [e[len("data: "):] for e in rest.split("\n\n") if e]
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual("".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]), alone)
        self.assertEqual(json.loads(events[-2])["choices"][0]["finish_reason"], "length")
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=5).close()

    def test_a_client_that_hangs_up_mid_stream_frees_its_place(self):
        server = Server(long_context_model(), "--max-batch", "1")
        try:
            connection, _, _ = open_stream(server.port, greedy("the quick", 1000))
            connection.sock.shutdown(socket.SHUT_RDWR)
            connection.close()
            deadline = time.time() + 60
            while server.request("GET", "/health")[2]["completions_cancelled"] == 0:
                self.assertLess(time.time(), deadline, "the completion went on without its client")
                time.sleep(0.01)
            self.assertEqual(server.request("GET", "/health")[2]["completions_pending"], 0)
            self.assertEqual(server.complete(greedy("the quick", 5))["choices"][0]["finish_reason"], "length")
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    shutil.rmtree(WORK, ignore_errors=True)  # a model trained by this build, not an earlier one's
    unittest.main(argv=sys.argv[:1], verbosity=2)
