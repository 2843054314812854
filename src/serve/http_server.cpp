#include "dstrain/serve/http_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <deque>
#include <optional>
#include <sstream>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

}  // namespace

std::string json_error(unsigned status, const std::string& message, const std::string& param) {
  const char* type = status == 503   ? "server_overloaded"
                     : status == 500 ? "server_error"
                     : status == 404 ? "not_found_error"
                                     : "invalid_request_error";
  const nlohmann::json error = {{"error",
                                 {{"message", message},
                                  {"type", type},
                                  {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                                  {"code", status}}}};
  return error.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class HttpConnection;

struct HttpServer::State : std::enable_shared_from_this<HttpServer::State> {
  HttpOptions options;
  HttpHandler handler;
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  net::signal_set signals{io, SIGTERM, SIGINT};
  net::steady_timer drain_timer{io};
  bool draining = false;
  int64_t open_exchanges = 0;  // requests read and not yet answered in full
  std::vector<std::weak_ptr<HttpConnection>> connections;

  void accept();
  void drain();
};

// One connection: read a request, hand it to the handler, write its answer, read the next.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(tcp::socket socket, std::shared_ptr<HttpServer::State> server)
      : stream_(std::move(socket)), server_(std::move(server)) {}

  void read_request() {
    parser_.emplace();
    parser_->body_limit(server_->options.body_limit);
    stream_.expires_after(server_->options.idle_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  // Closes a connection that waits for its next request (the drain).
  void close_if_idle() {
    if (!in_exchange_) close();
  }

  // The handler's answer, on the I/O thread.
  void respond(unsigned status, const std::string& json, const HttpHeaders& headers) {
    if (!in_exchange_ || streaming_) return;
    http::response<http::string_body> response{static_cast<http::status>(status), 11};
    response.set(http::field::server, "dstrain");
    response.set(http::field::content_type, "application/json");
    for (const auto& [name, value] : headers) response.set(name, value);
    response.keep_alive(keep_alive_ && !server_->draining);
    response.body() = json;
    response.prepare_payload();
    std::ostringstream out;
    out << response;
    write(out.str(), /*ends_exchange=*/true, !response.keep_alive());
  }

  void begin_events() {
    if (!in_exchange_ || streaming_) return;
    streaming_ = true;
    http::response<http::empty_body> response{http::status::ok, 11};
    response.set(http::field::server, "dstrain");
    response.set(http::field::content_type, "text/event-stream");
    response.set(http::field::cache_control, "no-cache");
    response.keep_alive(keep_alive_ && !server_->draining);
    response.chunked(true);
    std::ostringstream out;
    out << response.base();
    close_after_ = !response.keep_alive();
    write(out.str(), false, false);
  }

  void event(const std::string& data) {
    if (!in_exchange_ || !streaming_) return;
    write(beast::buffers_to_string(http::make_chunk(net::buffer("data: " + data + "\n\n"))), false, false);
  }

  void end_events() {
    if (!in_exchange_ || !streaming_) return;
    write(beast::buffers_to_string(http::make_chunk_last()), true, close_after_);
  }

  void on_client_gone(std::function<void()> gone) { gone_ = std::move(gone); }

 private:
  void on_read(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      begin_exchange();
      keep_alive_ = false;
      return respond(413, json_error(413, "the request body is larger than the limit (" +
                                              std::to_string(server_->options.body_limit) + " bytes)"), {});
    }
    if (ec == http::error::end_of_stream || ec == net::error::operation_aborted || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::eof)
      return close();
    if (ec) {  // not HTTP: one answer, then the connection closes
      begin_exchange();
      keep_alive_ = false;
      return respond(400, json_error(400, "malformed HTTP request: " + ec.message()), {});
    }
    http::request<http::string_body> request = parser_->release();
    begin_exchange();
    keep_alive_ = request.keep_alive();
    if (server_->draining)
      return respond(503, json_error(503, "the server is shutting down"), {{"Retry-After", "1"}});
    stream_.expires_never();  // the answer may take as long as the completion does
    HttpRequest plain{std::string(request.method_string()), std::string(request.target()), std::move(request.body())};
    server_->handler(plain, exchange());
  }

  void begin_exchange() {
    in_exchange_ = true;
    streaming_ = false;
    gone_ = nullptr;
    ++server_->open_exchanges;
  }

  void end_exchange() {
    if (!in_exchange_) return;
    in_exchange_ = false;
    --server_->open_exchanges;
  }

  std::shared_ptr<HttpExchange> exchange();

  void write(std::string bytes, bool ends_exchange, bool close_after) {
    outbox_.push_back({std::move(bytes), ends_exchange, close_after});
    if (outbox_.size() == 1) write_next();
  }

  void write_next() {
    stream_.expires_after(server_->options.write_timeout);
    net::async_write(stream_, net::buffer(outbox_.front().bytes),
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_written(ec); });
  }

  void on_written(beast::error_code ec) {
    if (ec) return client_gone();
    const Outgoing done = std::move(outbox_.front());
    outbox_.pop_front();
    if (!outbox_.empty()) return write_next();
    if (!done.ends_exchange) return stream_.expires_never();
    end_exchange();
    if (done.close_after) return close();
    read_request();
  }

  void client_gone() {
    outbox_.clear();
    if (in_exchange_ && gone_) gone_();
    end_exchange();
    close();
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  struct Outgoing {
    std::string bytes;
    bool ends_exchange, close_after;
  };
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<HttpServer::State> server_;
  std::deque<Outgoing> outbox_;
  bool in_exchange_ = false, streaming_ = false, keep_alive_ = true, close_after_ = false;
  std::function<void()> gone_;
};

namespace {

// The handler's side of a connection's exchange: each call runs on the I/O thread, at once when
// made there, else posted to it. (Posted from the I/O thread itself, a call could run after one the
// engine's thread posts later: Asio queues a running thread's posts apart. The events of a
// stream would then overtake its header.)
class ConnectionExchange : public HttpExchange {
 public:
  ConnectionExchange(std::shared_ptr<HttpConnection> connection, net::io_context& io)
      : connection_(std::move(connection)), io_(io) {}
  void respond(unsigned status, std::string json, HttpHeaders headers) override {
    net::dispatch(io_, [s = connection_, status, json = std::move(json), headers = std::move(headers)] {
      s->respond(status, json, headers);
    });
  }
  void begin_events() override { net::dispatch(io_, [s = connection_] { s->begin_events(); }); }
  void event(std::string data) override {
    net::dispatch(io_, [s = connection_, data = std::move(data)] { s->event(data); });
  }
  void end_events() override { net::dispatch(io_, [s = connection_] { s->end_events(); }); }
  void on_client_gone(std::function<void()> gone) override {
    net::dispatch(io_, [s = connection_, gone = std::move(gone)]() mutable { s->on_client_gone(std::move(gone)); });
  }

 private:
  std::shared_ptr<HttpConnection> connection_;
  net::io_context& io_;
};

}  // namespace

std::shared_ptr<HttpExchange> HttpConnection::exchange() {
  return std::make_shared<ConnectionExchange>(shared_from_this(), server_->io);
}

void HttpServer::State::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec) return;  // closed by the drain
    auto connection = std::make_shared<HttpConnection>(std::move(socket), shared_from_this());
    // (The list forgets closed connections as it grows.)
    connections.erase(
        std::remove_if(connections.begin(), connections.end(), [](const auto& c) { return c.expired(); }),
        connections.end());
    connections.push_back(connection);
    connection->read_request();
    accept();
  });
}

void HttpServer::State::drain() {
  if (!draining) {
    draining = true;
    beast::error_code ignored;
    acceptor.close(ignored);
  }
  if (open_exchanges > 0) {  // look again shortly
    drain_timer.expires_after(std::chrono::milliseconds(20));
    drain_timer.async_wait([this](beast::error_code ec) {
      if (!ec) drain();
    });
    return;
  }
  for (const std::weak_ptr<HttpConnection>& weak : connections)
    if (const std::shared_ptr<HttpConnection> connection = weak.lock()) connection->close_if_idle();
  io.stop();
}

HttpServer::HttpServer(const HttpOptions& options, HttpHandler handler) : state_(std::make_shared<State>()) {
  state_->options = options;
  state_->handler = std::move(handler);
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(options.host, ec);
  if (ec) throw config_error("--host", options.host, "an IP address (127.0.0.1, 0.0.0.0, ::1, ...)");
  const tcp::endpoint endpoint{address, options.port};
  state_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) state_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) state_->acceptor.bind(endpoint, ec);
  if (!ec) state_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw config_error("--port", std::to_string(options.port),
                       "cannot listen on " + options.host + ":" + std::to_string(options.port) + " (" + ec.message() + ")");
}

HttpServer::~HttpServer() = default;

uint16_t HttpServer::port() const { return state_->acceptor.local_endpoint().port(); }

void HttpServer::run() {
  state_->signals.async_wait([state = state_](beast::error_code ec, int) {
    if (!ec) state->drain();
  });
  state_->accept();
  state_->io.run();
}

}  // namespace dstrain
