// What happens to LMS memory across fork().
//
// Note [Fork]
// ===========
// The problem. The POSIX backend's pools are MAP_SHARED memfds, so after a
// plain fork() parent and child map the same physical pages at the same
// addresses while each runs its own copy of the engine: the child evicts a
// parent's tensor and hands its device granule to a new tensor, or both
// processes take the same free granule, and each silently overwrites the
// other's tensors. Stock TensorFlow's CPU memory is private, copy-on-write
// across fork, so users expect the child to see a snapshot and nothing more.
//
// The choice: the child gets its own memory (rather than an error when it
// first touches LMS memory). PrepareFork, in the parent before fork() and
// with the engine's lock held, copies each pool into a new memfd (data
// extents only: SEEK_DATA/SEEK_HOLE skip what was never written, which for a
// sparse host pool is nearly all of it) and lists every mapping of the old
// pool files (allocations' slots and the copy windows) from /proc/self/maps.
// In the child, AfterForkInChild maps the new files at exactly those
// addresses with the same offsets and protections, so every address, every
// granule id and all of the engine's state stay valid and only the physical
// pages differ. The parent closes its references to the new files and keeps
// its own. The copy is made before fork() returns anywhere, so neither
// process can change the snapshot: it is the child's state at the fork, as
// copy-on-write would give. (Bytes a kernel on another thread is writing
// during the fork are torn in the child's copy, as they would be under
// copy-on-write; that kernel does not exist in the child.)
//
// Locks. The child has only the forking thread. A lock held by another
// thread at fork() stays locked forever in the child, and that thread may be
// half-way through an eviction (bytes copied, mapping not yet switched). So
// the prepare handler takes every registered engine's lock (in registration
// order, under the registry's lock) before fork(), and the parent and child
// handlers release them after: the child inherits consistent engines with
// unlocked mutexes, and no backend call runs while the pools are copied.
// Lock order: registry lock, then engine locks; nothing takes the registry
// lock while holding an engine lock (Create registers and ~Engine
// unregisters without the engine's lock). The engine never calls out to code
// that could fork while holding its lock, so the prepare handler cannot
// deadlock on its own thread. Threads waiting on the engine's condition
// variable do not exist in the child: it is re-created there.
//
// Cost and limits. Every fork() copies the pools' written data (the device
// and evicted memory in use or once used), in the parent, before fork()
// returns; vfork/posix_spawn (subprocess.Popen without preexec_fn) run no
// atfork handler and copy nothing, and "spawn" multiprocessing children
// start a fresh process. If the copy fails (no memory for the new files),
// the child cannot have its own memory; it must still never write the
// parent's: AfterForkInChild then replaces every mapping of the pools with
// inaccessible memory and says so on stderr, so the child faults on its
// first touch of LMS memory instead of corrupting the parent.
// TensorFlow itself is not fork-safe: a child whose TensorFlow thread pools
// were busy at the fork may hang in TensorFlow; the engine will not.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_FORK_HANDLERS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_FORK_HANDLERS_H_

namespace lms {

class Engine;

// Adds `engine` to the engines the process's fork handlers (installed with
// pthread_atfork on the first call) lock and carry across fork(). Called by
// Engine::Create once the engine works; `engine` must not hold its lock.
void RegisterForFork(Engine* engine);
// Removes it (a no-op for an engine never registered). Called first thing in
// ~Engine, so the handlers never see a dying engine.
void UnregisterForFork(Engine* engine);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_FORK_HANDLERS_H_
