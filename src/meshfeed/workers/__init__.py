"""Record transforms: a function run on every example, in worker processes, threads or
Ray actors.

``Loader(record_transform=fn, num_workers=n)`` decodes and augments one example at a
time, off the loading thread. Worker processes start with ``python -c`` (not by
re-running the user's script), get ``fn`` by value with cloudpickle, read their rows
from shared memory and write their output there, in order (in /dev/shm, or in files
when /dev/shm is too small, said once on stderr); a record that raises is named by
its example and, where the source says, its file, in one message whatever the worker,
and a worker that dies by the example it was on. ``worker_type="threads"`` runs the
same on a thread pool instead, and ``worker_type="ray"`` on Ray actors anywhere on a
cluster, which read the source themselves (only ids go out) and whose lost chunks are
computed again. The output never depends on the number or the kind of workers. This
layer knows sources' field specs and the keyed hash that seeds each record's
generator, and nothing of devices or steps.

Modules, lowest first (each imports only modules listed before it)::

    _bare            python -c processes that import meshfeed bare: no JAX, no user script
    _blocks          where shared blocks live: /dev/shm, reserved, or files when it is too small
    _shared_rows     an in-memory source copied into shared memory once, rows gathered there
    _layouts         a chunk's rows in a shared block: written, staged, read back, gathered
    _shm             shared memory: output slots, input blocks, a worker's maps of them
    _record_errors   a record's failure named the same from every worker: id, file, error
    _record_rng      each record's generator, keyed by (seed, epoch, example id)
    _record_rows     a record transform over rows, a chunk at once or one by one (no JAX)
    _worker_loop     what a worker process runs: bootstrap without JAX or __main__, serve chunks
    _thread_workers  worker_type="threads": record transforms on a thread pool
    _processes       worker processes: started bare, stderr copied, deaths told; send_by_value
    _workers         the pool of worker processes: start, chunks in and out, deaths, shutdown
    _ray_actor       what a Ray record worker runs: ids in, the source read there, rows out
    _ray_crew        the Ray actors of a pool: started, seen to start, lost and replaced
    _ray_workers     worker_type="ray": Ray actors, work keyed by (step, chunk), redone if lost
    _pending         Rows: a step's transformed rows; Pending: rows in the workers' hands
    _records         the record stage: each step's rows through the workers, thread-safe

Users import these names from ``meshfeed``; this package exports nothing of its own.
"""

__all__: list[str] = []
