// The HTTP/1.1 side of `dstrain serve`, on Boost.Beast: connections (keep-alive, one exchange at a
// time each), a bound on a request's body, timeouts on idle and stalled connections, answers as
// whole responses or as server-sent events, and a drain on SIGTERM or SIGINT: no new connection
// or request is taken (503), the exchanges in flight finish, then `run` returns. One I/O thread;
// a route may answer from any thread (what it says is handed to that thread).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dstrain {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // "/v1/completions" (with any query string)
  std::string body;
};

class HttpConnection;

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// One request's answer. Either respond once, or begin_events, any events, end_events. Safe from
// any thread; calls after the client has gone do nothing.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual void respond(unsigned status, std::string json, HttpHeaders headers = {}) = 0;
  virtual void begin_events() = 0;                      // 200, text/event-stream
  virtual void event(std::string data) = 0;             // "data: DATA\n\n"
  virtual void end_events() = 0;
  // `gone` runs once (on the I/O thread) if the client disconnects before the answer is complete.
  virtual void on_client_gone(std::function<void()> gone) = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<HttpExchange>)>;

struct HttpOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (port() says which)
  size_t body_limit = 1 << 20;  // larger bodies get 413
  std::chrono::seconds idle_timeout{60};   // a connection waiting for its next request
  std::chrono::seconds write_timeout{60};  // a client that stops reading
};

class HttpServer {
 public:
  // Binds at once: throws Error(kUsage) naming --host/--port when it cannot.
  HttpServer(const HttpOptions& options, HttpHandler handler);
  ~HttpServer();
  uint16_t port() const;
  // Serves until SIGTERM or SIGINT, then drains (see above) and returns.
  void run();

 private:
  friend class HttpConnection;  // one connection (http_server.cpp)
  struct State;
  std::shared_ptr<State> state_;
};

// OpenAI's error object: {"error": {"message", "type", "param", "code"}}.
std::string json_error(unsigned status, const std::string& message, const std::string& param = "");

}  // namespace dstrain
