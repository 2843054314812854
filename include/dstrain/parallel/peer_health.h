// Which rank stopped answering? When a wait between ranks times out, the members of the group
// that are alive are waiting too (in this collective or another) or computing; a stopped, hung or
// dead one answers nothing. Every wait of the MPI and NCCL backends answers pings on a
// communicator of its own (a duplicate of the world), saying what it waits for; the rank whose
// wait timed out pings the group's members and names first those that stay silent, then what the
// others said. Safe from any thread: each answers with what it waits for itself. Where MPI lets
// only the main thread call it (below MPI_THREAD_MULTIPLE), the other threads' calls do nothing:
// they answer nothing and name nobody.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace dstrain::peer_health {

// Collective over MPI_COMM_WORLD, once, after MPI_Init: the ping communicator and every rank's
// host name. Without it the functions below do nothing and name nobody.
void start();
// Frees the communicator (before MPI_Finalize).
void stop();

// While it lives, pings this thread answers get `what()` (the operation it waits for).
class Waiting {
 public:
  explicit Waiting(const std::function<std::string()>& what);
  ~Waiting();
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  const std::function<std::string()>* previous_;
};

// Replies to the pings that have arrived: from every poll of a wait loop. Cheap (one probe).
void answer();

// Pings every other rank of the world (the silent one is often outside the group that timed out:
// its neighbours wait for it, and the group for them) and waits up to `grace_s` for the replies,
// answering others meanwhile. Returns "world rank 3 (host node2) did not answer within 2 s:
// stopped, hung outside communication, or dead; world rank 1 (host node1) was waiting in ...",
// with what the members of `group` (world ranks, at most 8 of them) said, or "" when every rank
// answered.
std::string silent_ranks(const std::vector<int>& group, double grace_s);

// What a wait that timed out reports, whichever backend waited: the silent ranks first
// (silent_ranks, granting a tenth of the timeout, 2 to 30 s), then "This rank's <what> did not
// finish within comm.timeout_s = <t> s"; or, when every rank answered, "<what> did not finish
// within comm.timeout_s = <t> s: a peer rank has died or hangs".
std::string timed_out(const std::string& what, const std::vector<int>& group, double timeout_s);

// The world ranks of `comm`'s members, in its rank order: the `group` of the functions above.
std::vector<int> world_ranks_of(MPI_Comm comm);
// "4 ranks (world ranks 0,1,2,3)", with at most 8 named.
std::string describe_group(const std::vector<int>& world_ranks);

}  // namespace dstrain::peer_health
