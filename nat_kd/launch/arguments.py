"""The options the commands that submit jobs share: --launcher, --cluster, --dry-run and --detach."""
from __future__ import annotations

from .settings import LAUNCHERS, LaunchError


def add_launcher_arguments(parser, docs: str, *, launcher: str, cluster: str, dry_run: str, detach: str) -> None:
    """--launcher, --cluster, --dry-run and --detach in an "on a cluster" group whose title names ``docs``, the
    page (and part) that documents them; each command says in its help what a job is for it (a study step, a
    generator shard)."""
    group = parser.add_argument_group(f"on a cluster ({docs})")
    group.add_argument("--launcher", choices=LAUNCHERS, default="local", help=launcher)
    group.add_argument("--cluster", metavar="CLUSTER.toml", help=cluster)
    group.add_argument("--dry-run", action="store_true", help=dry_run)
    group.add_argument("--detach", action="store_true", help=detach)


def check_launcher_arguments(args) -> None:
    """--detach and --cluster are about jobs, which the local launcher has none of: refused rather than ignored
    (--cluster goes with --dry-run, which prints the jobs whatever the launcher)."""
    if args.launcher != "local":
        return
    given = [flag for flag, value in (("--detach", args.detach), ("--cluster", args.cluster and not args.dry_run))
             if value]
    if given:
        raise LaunchError(f"{' and '.join(given)} without --launcher: the local launcher runs everything in this "
                          f"command, with no jobs; give --launcher slurm (or submitit-local), or leave "
                          f"{'them' if len(given) > 1 else 'it'} out")
