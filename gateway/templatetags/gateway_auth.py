"""Template tags for the admin: the single sign-on link."""

from __future__ import annotations

from django import template
from django.urls import reverse

register = template.Library()


@register.simple_tag
def sso_login_url() -> str:
    """The URL starting admin single sign-on, or ``""`` when it is not configured."""
    from gateway.core.auth.admin_sso import sso_enabled

    return reverse("oidc_authentication_init") if sso_enabled() else ""
