package controller

import (
	"maps"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func metaOf(e Election) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Name}
}

func sortedKeys(m map[string]bool) []string { return slices.Sorted(maps.Keys(m)) }
