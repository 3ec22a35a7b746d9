"""``distseg-hosts``: the host discovery script of an elastic run
(``horovodrun --host-discovery-script distseg-hosts``; ``distseg.cluster.elastic``)."""

from __future__ import annotations

import os

import click

from distseg.cluster import elastic
from distseg.core.errors import DistsegError, fail


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Print this job's hosts for horovodrun --host-discovery-script: the nodes of the
    Slurm job (host:tasks), or outside Slurm `localhost` (slots from --slots-per-host).
    Under horovodrun, first refuse in one line a start Horovod would wait on for
    --elastic-timeout seconds: one host without --network-interface, fewer slots than -np."""
    try:
        text = elastic.hosts_for_horovod(os.environ)
    except DistsegError as e:
        fail(str(e), e.exit_code)
    click.echo(text, nl=False)
