// The log's background writer (core/log_writer.h) with a reader that stops reading: a pipe of one
// page that nobody reads until all the lines are given. Giving them never waits for the reader;
// every line is then either read or counted as dropped.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>

#include "dstrain/core/log_writer.h"

using namespace dstrain;

TEST(LogWriter, AReaderThatStopsReadingBlocksNothingAndEveryLineIsReadOrCounted) {
  int ends[2];
  ASSERT_EQ(pipe(ends), 0);
  ASSERT_GT(fcntl(ends[1], F_SETPIPE_SZ, 4096), 0);
  FILE* unread = fdopen(ends[1], "w");
  ASSERT_NE(unread, nullptr);
  log::write_in_background();

  const std::string line = std::string(1023, 'x') + "\n";
  const int lines = 3 * static_cast<int>(log::kQueueBytes / line.size());  // three queues' worth
  std::future<void> giving = std::async(std::launch::async, [&] {
    for (int i = 0; i < lines; ++i) log::output(unread, line);
  });
  // A bound against a hang only: without the queue the second line would wait forever.
  ASSERT_EQ(giving.wait_for(std::chrono::seconds(120)), std::future_status::ready) << "output() waited for the reader";
  EXPECT_GT(log::dropped_lines(), 0);

  // The reader comes back: what was queued arrives, whole lines, and the count adds up.
  std::future<size_t> reading = std::async(std::launch::async, [&] {
    size_t bytes = 0;
    char buffer[65536];
    for (ssize_t n; (n = read(ends[0], buffer, sizeof buffer)) > 0;) bytes += static_cast<size_t>(n);
    return bytes;
  });
  EXPECT_TRUE(log::drain(30));
  std::fclose(unread);  // the reader sees the end
  const size_t read_bytes = reading.get();
  close(ends[0]);
  EXPECT_EQ(read_bytes % line.size(), 0u);
  EXPECT_EQ(static_cast<int64_t>(read_bytes / line.size()) + log::dropped_lines(), lines);
}
