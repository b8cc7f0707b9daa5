"""The line `python -m hosting` logs about where the Live page of every replica may connect (PAGED_LAB_LIVE_HOSTS,
`core/hosts.py`): the default (the lab-started core.serve's loopback ports) said plainly, a warning when the
operator allowed any public host or a network holding the cloud metadata address."""

import ipaddress

from core.limits import Limits

METADATA = ipaddress.ip_address("169.254.169.254")  # where clouds serve instance credentials


def live_hosts_notice(limits: Limits) -> tuple[bool, str]:
    """(is it a warning, the line to log)."""
    policy = limits.live_policy
    if policy.off:
        return False, "hosting: the Live page is off (PAGED_LAB_LIVE_HOSTS=off)"
    if policy.default:
        return False, (
            f"hosting: the Live page may read only the lab-started core.serve ({policy.text}); set "
            "PAGED_LAB_LIVE_HOSTS to add your vLLM hosts"
        )
    risks = []
    if policy.any_public:
        risks.append("'*' lets anyone who can open the page make this host fetch any public address")
    if any(e.kind == "network" and e.network.version == 4 and METADATA in e.network for e in policy.entries):
        risks.append("a listed network holds the cloud metadata address 169.254.169.254")
    if not risks:
        return False, f"hosting: the Live page may read PAGED_LAB_LIVE_HOSTS={policy.text}"
    return True, f"hosting: WARNING: PAGED_LAB_LIVE_HOSTS={policy.text}: {'; '.join(risks)}"
