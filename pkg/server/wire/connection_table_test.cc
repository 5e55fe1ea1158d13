#include "pkg/server/wire/connection_table.h"

#include <map>

#include "gtest/gtest.h"

namespace weightcache::server {
namespace {

// A caller in pod "p<n>" (uid n).
Caller Of(int n, const std::string& slot = "") {
  Caller c;
  c.cred.uid = static_cast<uid_t>(n);
  c.cred.pid = 100 + n;
  c.slot = slot;
  c.unit.kind = tenant::UnitKind::kPod;
  c.unit.pod = "p" + std::to_string(n);
  return c;
}

// When gRPC closed a connection and the kernel gave its number to the next accepted
// connection before the listener reaped, the old entry is replaced, never kept beside.
TEST(ConnectionTable, AReusedNumberReplacesTheClosedConnection) {
  ConnectionTable t;
  for (uint64_t ino = 1; ino <= 100; ++ino) t.Insert(7, ino, Of(0));  // one number, 100 sockets
  EXPECT_EQ(t.size(), 1u);
  t.Insert(7, 101, Of(5));  // taken by another pod
  EXPECT_EQ(t.Find(7, 101)->unit.pod, "p5");
  EXPECT_FALSE(t.Find(7, 100).has_value());
}

// The caller is found only while the number names the socket it was recorded with: a call
// that outlived its connection is never taken for the connection that now holds the number.
TEST(ConnectionTable, ACallerIsFoundOnlyUnderItsOwnSocket) {
  ConnectionTable t;
  t.Insert(7, 70, Of(3, "slot-a"));
  auto c = t.Find(7, 70);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->cred.uid, 3u);
  EXPECT_EQ(c->slot, "slot-a");
  EXPECT_FALSE(t.Find(7, 71).has_value()) << "another socket under the same number";
  EXPECT_FALSE(t.Find(7, 0).has_value()) << "a closed descriptor";
  EXPECT_FALSE(t.Find(8, 70).has_value());
}

TEST(ConnectionTable, ReapDropsClosedAndReusedNumbers) {
  ConnectionTable t;
  t.Insert(4, 40, Of(1));
  t.Insert(5, 50, Of(1));
  t.Insert(6, 60, Of(2));
  std::map<int, uint64_t> now{{4, 40}, {5, 0 /* closed */}, {6, 61 /* reused */}};
  EXPECT_EQ(t.Reap([&now](int fd) { return now[fd]; }), 2u);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_TRUE(t.Find(4, 40).has_value());
  t.Clear();
  EXPECT_EQ(t.size(), 0u);
}

}  // namespace
}  // namespace weightcache::server
