package testenv

import (
	"context"
	"path/filepath"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServiceAccountKubeconfig creates the ServiceAccount namespace/name (and
// its namespace) if needed, asks the apiserver for a token (TokenRequest),
// and writes a kubeconfig acting as it. It returns the kubeconfig's path.
func (cp *ControlPlane) ServiceAccountKubeconfig(t testing.TB, namespace, name string) string {
	t.Helper()
	ctx := context.Background()
	cs := cp.Clientset(t)
	EnsureNamespace(t, cp, namespace)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating service account %s/%s: %v", namespace, name, err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token request for %s/%s: %v", namespace, name, err)
	}
	path, err := cp.writeKubeconfig(filepath.Join(t.TempDir(), name+".kubeconfig"), "system:serviceaccount:"+namespace+":"+name, tr.Status.Token)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// EnsureNamespace creates a namespace unless it exists.
func EnsureNamespace(t testing.TB, cp *ControlPlane, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cp.Clientset(t).CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// Grant binds a ClusterRole with rules to a ServiceAccount, cluster-wide when
// namespace is empty, else in that namespace (through a RoleBinding).
func (cp *ControlPlane) Grant(t testing.TB, saNamespace, saName, roleName, namespace string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	cs := cp.Clientset(t)
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: roleName}, Rules: rules}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating cluster role %s: %v", roleName, err)
	}
	subjects := []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: saNamespace, Name: saName}}
	ref := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: roleName}
	var err error
	if namespace == "" {
		_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: roleName}, Subjects: subjects, RoleRef: ref}, metav1.CreateOptions{})
	} else {
		_, err = cs.RbacV1().RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: roleName, Namespace: namespace}, Subjects: subjects, RoleRef: ref}, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("binding %s: %v", roleName, err)
	}
}
