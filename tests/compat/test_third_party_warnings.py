"""TODOV1 warnings whose call site is inside an installed third-party package (accelerate passing
``mpu=`` to ``deepspeed.initialize``) say so: package and version, "not your code", what the user can
do; once per package, as :class:`~compat.deprecation.ThirdPartyLegacyWarning` (a filter silences it).
The package here is a real installed distribution in a temporary ``site-packages`` directory."""

from __future__ import annotations

import sys
import textwrap
import warnings

import pytest

from compat import deprecation
from compat.deprecation import LegacyAPIDeprecationWarning, ThirdPartyLegacyWarning, warn_legacy

pytestmark = pytest.mark.torch_releases


def old_api() -> None:
    warn_legacy("deepspeed.initialize(mpu=...)", "the config 'mesh' section (or mesh=)")


@pytest.fixture
def vendor(tmp_path, monkeypatch):
    """``vendorpkg`` 2.3.4 installed in a site-packages directory; it calls old_api from two sites."""
    site = tmp_path / "lib" / "site-packages"
    (site / "vendorpkg").mkdir(parents=True)
    (site / "vendorpkg" / "__init__.py").write_text(
        textwrap.dedent("""
        from test_third_party_warnings import old_api
        def first():
            old_api()
        def second():
            old_api()
    """)
    )
    info = site / "vendorpkg-2.3.4.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendorpkg\nVersion: 2.3.4\n")
    (info / "top_level.txt").write_text("vendorpkg\n")
    (info / "RECORD").write_text("vendorpkg/__init__.py,,\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(deprecation, "_third_party_warned", set())
    # old_api's entry (a catalog name with this test's own text) must not outlive the test
    monkeypatch.setattr(deprecation, "_ENTRIES", dict(deprecation._ENTRIES))
    from compat import call_sites

    call_sites._distribution.cache_clear()
    import vendorpkg

    yield vendorpkg
    sys.modules.pop("vendorpkg", None)


def test_a_third_party_call_site_says_whose_it_is_once_per_package(vendor):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vendor.first()
        vendor.second()
        vendor.first()
    (only,) = caught
    assert only.category is ThirdPartyLegacyWarning and issubclass(ThirdPartyLegacyWarning, LegacyAPIDeprecationWarning)
    text = " ".join(str(only.message).split())  # wrapped at 100 characters
    assert max(len(line) for line in str(only.message).splitlines()) <= 100
    assert text.startswith("TODOV1: deepspeed.initialize(mpu=...) is called by vendorpkg 2.3.4 (vendorpkg/__init__.py:")
    assert "not your code" in text and "upgrade vendorpkg" in text and "ThirdPartyLegacyWarning" in text
    assert only.filename.endswith("vendorpkg/__init__.py")


def test_the_users_own_call_site_still_gets_the_plain_warning(vendor):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vendor.first()
        old_api()  # this test module is the user's code (not in a site-packages directory)
    assert [w.category for w in caught] == [ThirdPartyLegacyWarning, LegacyAPIDeprecationWarning]
    assert "(ds-migrate --explain initialize.mpu)" in " ".join(str(caught[1].message).split())
    assert "not your code" not in str(caught[1].message)


def test_the_switch_silences_third_party_warnings_only(vendor):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=ThirdPartyLegacyWarning)
        vendor.first()
        old_api()
    assert [w.category for w in caught] == [LegacyAPIDeprecationWarning]
