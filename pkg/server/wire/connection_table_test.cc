#include "pkg/server/wire/connection_table.h"

#include <map>

#include "gtest/gtest.h"

namespace weightcache::server {
namespace {

// A caller in pod "p<n>" (uid n as well, unless told otherwise).
Caller Of(int n, const std::string& slot = "", uid_t uid = static_cast<uid_t>(-1)) {
  Caller c;
  c.cred.uid = uid == static_cast<uid_t>(-1) ? static_cast<uid_t>(n) : uid;
  c.cred.pid = 100 + n;
  c.slot = slot;
  c.unit.kind = tenant::UnitKind::kPod;
  c.unit.pod = "p" + std::to_string(n);
  return c;
}
std::string Key(int n) { return Of(n).unit.Key(); }

ConnectionTable::Limits Small() {
  ConnectionTable::Limits l;
  l.max_connections = 10;
  l.max_connections_per_pod = 2;
  l.over_cap_held = 1;
  return l;
}

using Admission = ConnectionTable::Admission;

// Finding (issue 26): when gRPC closed a connection and the kernel gave its number to the
// next accepted connection before the listener reaped, the old entry was overwritten and its
// unit's count never went down: after enough such events a unit was "over its cap" until the
// daemon restarted.
TEST(ConnectionTable, AReusedNumberReleasesTheClosedConnectionsCount) {
  ConnectionTable t(Small());
  for (uint64_t ino = 1; ino <= 100; ++ino) t.Insert(7, ino, Of(0));  // one number, 100 sockets
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.OfUnit(Key(0)), 1u);
  EXPECT_EQ(t.Admit(Key(0)), Admission::kServe);
  t.Insert(7, 101, Of(5));  // taken by another pod
  EXPECT_EQ(t.OfUnit(Key(0)), 0u);
  EXPECT_EQ(t.OfUnit(Key(5)), 1u);
}

// The caller is found only while the number names the socket it was recorded with: a call
// that outlived its connection is never taken for the connection that now holds the number.
TEST(ConnectionTable, ACallerIsFoundOnlyUnderItsOwnSocket) {
  ConnectionTable t(Small());
  t.Insert(7, 70, Of(3, "slot-a"));
  auto c = t.Find(7, 70);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->cred.uid, 3u);
  EXPECT_EQ(c->slot, "slot-a");
  EXPECT_EQ(c->unit_connections, 1u);
  EXPECT_FALSE(t.Find(7, 71).has_value()) << "another socket under the same number";
  EXPECT_FALSE(t.Find(7, 0).has_value()) << "a closed descriptor";
  EXPECT_FALSE(t.Find(8, 70).has_value());
}

// Finding (issue 26): connections past a uid's cap were accepted and held without bound (each
// answered RESOURCE_EXHAUSTED), so one uid could fill the table that every uid shares. Now a
// few are held to tell it why, and the rest are closed at accept.
TEST(ConnectionTable, PastItsCapAUidIsToldOnAFewConnectionsAndClosedOnTheRest) {
  ConnectionTable t(Small());
  int fd = 10;
  std::map<Admission, int> seen;
  for (int i = 0; i < 50; ++i) {
    const Admission a = t.Admit(Key(0));
    ++seen[a];
    if (a == Admission::kServe || a == Admission::kServeOverCap) t.Insert(fd++, 1000 + i, Of(0));
  }
  EXPECT_EQ(seen[Admission::kServe], 2);
  EXPECT_EQ(seen[Admission::kServeOverCap], 1);
  EXPECT_EQ(seen[Admission::kCloseUnitCap], 47);
  EXPECT_EQ(t.size(), 3u);
  // Other pods still get in, up to the total.
  for (int u = 1; u <= 7; ++u) {
    ASSERT_EQ(t.Admit(Key(u)), Admission::kServe) << u;
    t.Insert(fd++, 2000 + u, Of(u));
  }
  EXPECT_EQ(t.size(), 10u);
  EXPECT_EQ(t.Admit(Key(8)), Admission::kCloseTotal);
}

TEST(ConnectionTable, ReapDropsClosedAndReusedNumbersAndFreesTheirCounts) {
  ConnectionTable t(Small());
  t.Insert(4, 40, Of(1));
  t.Insert(5, 50, Of(1));
  t.Insert(6, 60, Of(2));
  std::map<int, uint64_t> now{{4, 40}, {5, 0 /* closed */}, {6, 61 /* reused */}};
  EXPECT_EQ(t.Reap([&now](int fd) { return now[fd]; }), 2u);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.OfUnit(Key(1)), 1u);
  EXPECT_EQ(t.OfUnit(Key(2)), 0u);
  EXPECT_TRUE(t.Find(4, 40).has_value());
  t.Clear();
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.OfUnit(Key(1)), 0u);
}

// Issue 47, finding 2: the caps were per uid, and every engine pod is root: a pod holding its
// cap left every other root pod refused (0/5 Acquires beside 300 idle connections). The
// cap is per pod: pod 2, also uid 0, is served while pod 1 is past its cap.
TEST(ConnectionTable, APodPastItsCapLeavesAnotherPodOfTheSameUidServed) {
  ConnectionTable t(Small());
  int fd = 10;
  for (int i = 0; i < 3; ++i) t.Insert(fd++, 100 + i, Of(1, "", /*uid=*/0));
  EXPECT_EQ(t.Admit(Key(1)), Admission::kCloseUnitCap);
  EXPECT_EQ(t.Admit(Key(2)), Admission::kServe);
  t.Insert(fd++, 200, Of(2, "", /*uid=*/0));
  EXPECT_EQ(t.OfUnit(Key(2)), 1u);
  EXPECT_EQ(t.Find(fd - 1, 200)->unit_connections, 1u);
}

// Unresolved peers (gone or a zombie at accept, or not visible) are one unit with its own,
// smaller cap: connections from many gone pids fill that unit, never the table.
TEST(ConnectionTable, UnresolvedPeersShareOneUnitWithItsOwnCap) {
  ConnectionTable::Limits l = Small();
  l.max_connections_per_pod = 4;
  l.max_connections_unresolved = 1;
  ConnectionTable t(l);
  uint64_t ino = 1;
  for (int pid = 1000; pid < 1003; ++pid) {
    Caller c;
    c.cred.pid = pid;  // another pid each time: the same unit all the same
    ASSERT_EQ(c.unit.Key(), tenant::kUnresolvedKey);
    const Admission a = t.Admit(c.unit.Key());
    if (a == Admission::kCloseUnitCap) break;
    t.Insert(static_cast<int>(ino), ino, c);
    ++ino;
  }
  EXPECT_EQ(t.OfUnit(tenant::kUnresolvedKey), 2u);  // its cap (1) and one held over it
  EXPECT_EQ(t.CapOf(tenant::kUnresolvedKey), 1u);
  EXPECT_EQ(t.Admit(tenant::kUnresolvedKey), Admission::kCloseUnitCap);
  EXPECT_EQ(t.Admit(Key(3)), Admission::kServe);  // a pod: its own cap
  EXPECT_EQ(t.CapOf(Key(3)), 4u);
  const std::optional<Caller> found = t.Find(1, 1);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->unit_cap, 1u);
}

}  // namespace
}  // namespace weightcache::server
