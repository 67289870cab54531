"""Helpers for testing code that runs on many processes and devices.

``run_in_processes`` runs a function in N real JAX processes on 127.0.0.1 (gloo
collectives, CPU devices), the way ``meshfeed launch`` runs a script, and returns what
each returned. ``assert_resumes_identically`` restores a loader at every step of a
short stream and compares the rest with the uninterrupted stream. ``S3Server`` runs an
S3-compatible server on 127.0.0.1 (moto, from the ``dev`` extra), ``Proxy`` takes it
away and brings it back, and ``CountingProxy`` counts the requests a reader sends it by
kind (and can hold some back). ``counter_price`` times one add to the counters behind
``loader.stats()``.
"""

from meshfeed.cluster._launch import free_port as free_port
from meshfeed.testing._counting import counter_price as counter_price
from meshfeed.testing._http_proxy import CountingProxy as CountingProxy
from meshfeed.testing._processes import ProcessFailedError as ProcessFailedError
from meshfeed.testing._processes import cluster_env as cluster_env
from meshfeed.testing._processes import run_in_processes as run_in_processes
from meshfeed.testing._resume import assert_resumes_identically as assert_resumes_identically
from meshfeed.testing._resume import local_shards as local_shards
from meshfeed.testing._s3_server import Proxy as Proxy
from meshfeed.testing._s3_server import S3Server as S3Server

__all__ = [
    "CountingProxy",
    "ProcessFailedError",
    "Proxy",
    "S3Server",
    "assert_resumes_identically",
    "cluster_env",
    "counter_price",
    "free_port",
    "local_shards",
    "run_in_processes",
]
