package driver

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/bluesky-social/indigo/atproto/syntax"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	rbacac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/knotless-dev/knotless/internal/mount"
)

// FieldManager applies what a driver writes on a tenant (its RBAC, the
// mount identity).
const FieldManager = "knotless-agent"

// ImpersonatorRole is the ClusterRole of the mount identity on a tenant.
const ImpersonatorRole = "knotless:mount-impersonator"

// TenantAdminRole is the ClusterRole of the VM's admins on a tenant.
const TenantAdminRole = "knotless:tenant-admin"

// credentialIDExtra is the only extra the mount forwards:
// kcp-front-proxy passes the id of the caller's credential as one.
const credentialIDExtra = "authentication.kubernetes.io/credential-id"

// ImpersonationRules are what the mount identity may do on the tenant of
// vm: impersonate the users its admins name (and the shim's probe user),
// with any groups, and the credential-id extra; nothing else. No other
// user: a kcp user the tenant does not name as an admin has nothing to
// do there, and names such as system:kube-controller-manager carry the
// tenant's own rights. No other extra: kcp honours a warrant extra
// (authorization.kcp.io/warrant) as a second identity, system:masters
// included. Groups are not listed by name: the shim forwards a named
// admin's other kcp groups, and they add nothing to the admin's every
// right; kcp refuses system:masters and its own privileged groups to an
// impersonator outside them (e2e TestAgentRunsComputeVMs tries both).
// Kubernetes does not refuse them (a kind tenant): there an impersonated
// admin in system:masters has what the admin has anyway.
func ImpersonationRules(vm VM) []rbacv1.PolicyRule {
	users := append([]string{mount.ProbeUser}, vm.AdminUsers...)
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"users"}, ResourceNames: users, Verbs: []string{"impersonate"}},
		{APIGroups: []string{""}, Resources: []string{"groups"}, Verbs: []string{"impersonate"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"userextras/" + credentialIDExtra}, Verbs: []string{"impersonate"}},
	}
}

// Grant lets mount (the identity whose credential the mount uses)
// impersonate on the tenant of cfg, and nothing else, and gives the VM's
// admins (its kcp users and groups, and its DIDs) every right. Every call applies both (server-side apply: an
// unchanged role is not written again), so a VM started by an older agent
// gets today's rules. cfg is the tenant's admin.
func Grant(ctx context.Context, cfg *rest.Config, vm VM, mount rbacv1.Subject) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	admin := []rbacv1.PolicyRule{
		{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}},
		{NonResourceURLs: []string{"*"}, Verbs: []string{"*"}},
	}
	var admins []rbacv1.Subject
	for _, u := range vm.AdminUsers {
		admins = append(admins, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: "User", Name: u})
	}
	for _, g := range vm.AdminGroups {
		admins = append(admins, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: "Group", Name: g})
	}
	for _, did := range vm.AdminDIDs {
		admins = append(admins, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: "User", Name: did})
	}
	for _, o := range []struct {
		role     string
		rules    []rbacv1.PolicyRule
		subjects []rbacv1.Subject
	}{
		{ImpersonatorRole, ImpersonationRules(vm), []rbacv1.Subject{mount}},
		{TenantAdminRole, admin, admins},
	} {
		if len(o.subjects) == 0 {
			continue
		}
		if err := ApplyRole(ctx, cs, FieldManager, o.role, o.rules, o.subjects); err != nil {
			return fmt.Errorf("granting %s: %w", o.role, err)
		}
	}
	return nil
}

// MaxAccessDIDs bounds the DIDs a tenant's RBAC lets in (AccessDIDs);
// maxBindings bounds the bindings of each kind read to find them.
const (
	MaxAccessDIDs = 256
	maxBindings   = 1000
)

// AccessDIDs returns the DIDs the tenant of cfg (its admin) names as
// users of its ClusterRoleBindings and RoleBindings, at most
// MaxAccessDIDs: first those of knotless's own bindings
// (knotless:tenant-admin, knotless:access:<role>), so that bindings made
// by others cannot push them out, then the others in order. At most
// maxBindings of each kind are read.
func AccessDIDs(ctx context.Context, cfg *rest.Config) ([]string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	var own, other []string
	add := func(name string, subjects []rbacv1.Subject) {
		for _, s := range subjects {
			if s.Kind != rbacv1.UserKind {
				continue
			}
			if _, err := syntax.ParseDID(s.Name); err != nil {
				continue
			}
			if strings.HasPrefix(name, "knotless:") {
				own = append(own, s.Name)
			} else {
				other = append(other, s.Name)
			}
		}
	}
	crbs, err := cs.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{Limit: maxBindings})
	if err != nil {
		return nil, err
	}
	for _, b := range crbs.Items {
		add(b.Name, b.Subjects)
	}
	rbs, err := cs.RbacV1().RoleBindings("").List(ctx, metav1.ListOptions{Limit: maxBindings})
	if err != nil {
		return nil, err
	}
	for _, b := range rbs.Items {
		add("", b.Subjects)
	}
	slices.Sort(own)
	slices.Sort(other)
	dids := slices.Compact(append(slices.Compact(own), other...))
	seen := map[string]bool{}
	out := dids[:0]
	for _, d := range dids {
		if !seen[d] && len(out) < MaxAccessDIDs {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out, nil
}

// ApplyRole applies, as the field manager manager, the ClusterRole name
// with rules and its binding to subjects (none: the binding names
// nobody).
func ApplyRole(ctx context.Context, cs kubernetes.Interface, manager, name string, rules []rbacv1.PolicyRule, subjects []rbacv1.Subject) error {
	opts := metav1.ApplyOptions{FieldManager: manager, Force: true}
	role := rbacac.ClusterRole(name)
	for _, r := range rules {
		role.WithRules(rbacac.PolicyRule().WithAPIGroups(r.APIGroups...).WithResources(r.Resources...).
			WithResourceNames(r.ResourceNames...).WithNonResourceURLs(r.NonResourceURLs...).WithVerbs(r.Verbs...))
	}
	if _, err := cs.RbacV1().ClusterRoles().Apply(ctx, role, opts); err != nil {
		return err
	}
	binding := rbacac.ClusterRoleBinding(name).
		WithRoleRef(rbacac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(name))
	for _, sub := range subjects {
		s := rbacac.Subject().WithKind(sub.Kind).WithName(sub.Name)
		if sub.APIGroup != "" {
			s.WithAPIGroup(sub.APIGroup)
		}
		if sub.Namespace != "" {
			s.WithNamespace(sub.Namespace)
		}
		binding.WithSubjects(s)
	}
	_, err := cs.RbacV1().ClusterRoleBindings().Apply(ctx, binding, opts)
	return err
}

// Alive reports whether pid is a live process (a zombie that init has not
// reaped yet is not). It says nothing of which process that is: a driver
// checks a Proc (Proc.Alive) before it signals one.
func Alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] != 'Z' && stat[i+2] != 'X'
}
