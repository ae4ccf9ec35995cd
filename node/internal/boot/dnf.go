package boot

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dynk8s/dynk8s/node/internal/system"
)

// The package transaction, as dnf4 (Fedora up to 40) and dnf5 (Fedora 41 on) both run it. What the pins rest on,
// each checked with real dnf4 and dnf5 against signed repositories (e2e TestBoxPackagesOnRealDnf):
//   - The upstream repositories' priority (1, Fedora's 99) makes dnf take their package over a Fedora package of the
//     same name that matches the same spec (dnf.conf(5), priority), but excludes nothing: a spec that only Fedora's
//     build matches (cri-o-1.34.* while the CRI-O repository lacks 1.34) would install Fedora's. So every Fedora
//     repository in the transaction excludes the pinned names (--setopt=<repo>.excludepkgs, dnf.conf(5)), and such a
//     spec fails (dnf4: "All matches were filtered out by exclude filtering", dnf5: "matches only excluded packages").
//   - The upstream repositories are written disabled, but that does not keep a later `dnf upgrade` off the pinned
//     packages: Fedora's newer cri-o or cri-tools replaces upstream's. After the transaction the agent locks the
//     pinned names at their installed versions with `dnf versionlock add` (dnf5's own command since 5.1.13,
//     rpm-software-management/dnf5 pull 1121; dnf4's versionlock plugin, which dnf4 names dnf-command(versionlock)
//     and the agent installs from Fedora's repositories when dnf4 answers "No such command: versionlock").
//   - The lock reads only the pinned repositories (--repo), as the install did: both locks take an installed
//     package's own version (dnf4's plugin from the rpmdb alone, dnf-plugins-core versionlock.py _write_locklist;
//     dnf5 prefers the installed version, dnf5/commands/versionlock/versionlock_add.cpp), yet both load every
//     enabled repository first (the plugin's available_repos demand, dnf5's LoadAvailableRepos::ENABLED). Without
//     --repo that is Fedora's updates, whose metadata (tens of megabytes from Fedora's mirrors) a fresh instance
//     would download and parse for the lock alone; the box's thin local repositories cannot show that cost.

func repoArgs(ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = "--repo=" + id
	}
	return out
}

// excludeArgs keep names out of each of repos for one dnf command.
func excludeArgs(repos, names []string) []string {
	if len(names) == 0 {
		return nil
	}
	out := make([]string, len(repos))
	for i, id := range repos {
		out[i] = "--setopt=" + id + ".excludepkgs=" + strings.Join(names, ",")
	}
	return out
}

// pinnedNames are the names of the packages node.json pins (cri-o of cri-o-1.34.*), in its order.
func pinnedNames(specs []string) []string {
	names := make([]string, 0, len(specs))
	for _, s := range specs {
		names = append(names, parseSpec(s).name)
	}
	return names
}

func (pr *preparer) dnfInstall(ctx context.Context, args ...string) error {
	base := []string{"install", "-y", "--setopt=install_weak_deps=False", "--setopt=tsflags=nodocs",
		"--setopt=max_parallel_downloads=10"}
	return system.DNFError("install", pr.host.Run(ctx, pr.clock.Timeout(0), false, "dnf", append(base, args...)...))
}

// packages: kubelet, kubeadm, cri-tools and CRI-O from the pinned upstream repos, and the Fedora dependencies the
// image lacks (rpm -q: container-selinux, iptables, nftables), in one dnf transaction, then the pins locked. Fedora's
// release repository joins only when the image lacks one of those; after a failed attempt the next adds Fedora's
// repositories and their updates, for a dependency the image lacks and none foresaw, or a newer image than GA.
func (pr *preparer) packages(ctx context.Context) error {
	for _, p := range pr.cfg.SystemPackages {
		if pr.host.Run(ctx, time.Minute, true, "rpm", "-q", "--whatprovides", p) != nil {
			pr.missing = append(pr.missing, p)
		}
	}
	if len(pr.missing) > 0 {
		pr.log.Printf("the image lacks %s (rpm -q): Fedora's release repository joins the transaction", strings.Join(pr.missing, " "))
	} else {
		pr.log.Printf("the image has %s (rpm -q): no Fedora repository metadata needed", strings.Join(pr.cfg.SystemPackages, " "))
	}
	desc := "install " + strings.Join(slices.Concat(pr.cfg.Packages, pr.missing), " ")
	if err := pr.clock.Retry(ctx, pr.log, desc, pr.installPackages); err != nil {
		return err
	}
	pr.startLock(ctx, pinnedNames(pr.cfg.Packages))
	return nil
}

// startLock locks names at their installed versions in the background (phase lock): the lock is a dnf command of
// its own, whose start alone (loading the repositories' metadata) took 0.45 s of a cold boot in the box, and nothing
// the boot does next uses dnf or the pins. markPrepared waits for it: the boot goes no further than kubeadm join
// without the lock, and no later boot skips the preparation (the prepared marker) without it.
func (pr *preparer) startLock(ctx context.Context, names []string) {
	ctx, pr.stopLock = context.WithCancel(ctx)
	pr.lockDone = make(chan error, 1)
	go func() {
		start := pr.clock.Now()
		err := pr.clock.Retry(ctx, pr.log, "lock "+strings.Join(names, " ")+" at their installed versions (dnf versionlock)",
			func(ctx context.Context) error { return pr.lockPins(ctx, names) })
		pr.lockTook = pr.clock.Now().Sub(start)
		if err == nil {
			pr.log.Printf("phase=lock took=%ss", system.Seconds(pr.lockTook))
		}
		pr.lockDone <- err
	}()
}

// waitLock waits for the lock startLock started, if one runs, and records it in the timeline.
func (pr *preparer) waitLock() error {
	if pr.lockDone == nil {
		return nil
	}
	err := <-pr.lockDone
	pr.lockDone = nil
	pr.tl.Add("lock", pr.lockTook)
	return err
}

// endLock stops a lock still running when the boot ends before it waited (a failed CRI-O start) and waits for it.
func (pr *preparer) endLock() { endBackground(pr.log, &pr.lockDone, pr.stopLock, "the pins' lock") }

func (pr *preparer) installPackages(ctx context.Context) error {
	var fedora []string
	if len(pr.missing) > 0 || pr.withUpdates {
		fedora = append(fedora, pr.cfg.SystemRepos...)
	}
	if pr.withUpdates {
		fedora = append(fedora, pr.cfg.UpdateRepos...)
	}
	args := slices.Concat(repoArgs(pr.cfg.Repos), repoArgs(fedora), excludeArgs(fedora, pinnedNames(pr.cfg.Packages)))
	err := pr.dnfInstall(ctx, slices.Concat(args, pr.cfg.Packages, pr.missing)...)
	switch {
	case err == nil:
		return nil
	case !pr.withUpdates:
		pr.withUpdates = true
		return fmt.Errorf("%w; the next attempt adds Fedora's repositories and their updates", err)
	case system.NoMatch(err.Error()):
		// Every repository that may hold a package has been asked: a spec none matches stays unmatched.
		return system.Permanent(fmt.Errorf("%w (no repository the boot may take it from has it: the pinned names "+
			"come from the pinned repositories only, never from Fedora's)", err))
	}
	return err
}

// lockPins locks names at their installed versions. dnf4 without its versionlock plugin answers "No such command":
// the plugin then comes from Fedora's repositories (with their updates: a plugin newer than the image's dnf needs
// them), and the lock is asked again.
func (pr *preparer) lockPins(ctx context.Context, names []string) error {
	lock := func() error {
		return system.DNFError("versionlock add", pr.host.Run(ctx, pr.clock.Timeout(time.Minute), false, "dnf",
			slices.Concat(repoArgs(pr.cfg.Repos), []string{"versionlock", "add"}, names)...))
	}
	err := lock()
	if err == nil || !strings.Contains(err.Error(), "No such command: versionlock") {
		return err
	}
	pr.log.Printf("this dnf has no versionlock command (dnf4 without its plugin): installing dnf-command(versionlock) " +
		"from Fedora's repositories")
	repos := slices.Concat(pr.cfg.SystemRepos, pr.cfg.UpdateRepos)
	if err := pr.dnfInstall(ctx, slices.Concat(repoArgs(repos), []string{"dnf-command(versionlock)"})...); err != nil {
		return fmt.Errorf("installing dnf's versionlock plugin: %w", err)
	}
	return lock()
}
