"""Hierarchy of cloud regions and MEC edge sites."""
